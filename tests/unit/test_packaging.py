"""pyproject.toml installs the folders engine/ and app/ as minisgl_engine and minisgl_app, every
subpackage included, and nothing called plain ``engine`` or ``app`` at the top level."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"engine": "minisgl_engine", "app": "minisgl_app"}
FOLDERS_INVERSE = {name: folder for folder, name in FOLDERS.items()}


@pytest.fixture(scope="module")
def setuptools_config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def package_folders() -> dict[str, Path]:
    """Import name -> folder, for every folder under engine/ and app/ with an __init__.py."""
    found = {}
    for folder, name in FOLDERS.items():
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            if "__pycache__" in init.parts:
                continue
            rel = init.parent.relative_to(ROOT / folder)
            found[".".join([name, *rel.parts])] = init.parent
    return found


def test_folders_map_to_prefixed_names(setuptools_config) -> None:
    assert setuptools_config["package-dir"] == FOLDERS_INVERSE


def test_every_package_folder_is_listed(setuptools_config) -> None:
    listed = set(setuptools_config["packages"])
    folders = package_folders()
    assert {"minisgl_engine", "minisgl_app"} <= set(folders)
    missing = sorted(set(folders) - listed)
    assert not missing, f"add to [tool.setuptools] packages: {missing}"


def test_every_listed_package_exists(setuptools_config) -> None:
    folders = package_folders()
    stale = sorted(set(setuptools_config["packages"]) - set(folders))
    assert not stale, (
        f"listed in [tool.setuptools] packages but no folder with __init__.py: {stale}"
    )
    assert len(setuptools_config["packages"]) == len(set(setuptools_config["packages"]))


def test_nothing_called_engine_or_app_is_installed(setuptools_config) -> None:
    for pkg in setuptools_config["packages"]:
        top = pkg.split(".")[0]
        assert top in ("minisgl_engine", "minisgl_app"), pkg
    assert "" not in setuptools_config.get("package-dir", {}), (
        "mapping the root would expose engine/ and app/"
    )
    assert not any(
        key.split(".")[0] in ("engine", "app") for key in setuptools_config.get("package-dir", {})
    )


def test_python_files_live_in_packages() -> None:
    """A folder of .py files without __init__.py would be left out of the wheel silently."""
    for folder in FOLDERS:
        for py in (ROOT / folder).rglob("*.py"):
            if "__pycache__" in py.parts:
                continue
            assert (py.parent / "__init__.py").is_file(), (
                f"{py.parent.relative_to(ROOT)} has .py files but no __init__.py"
            )


def test_package_data_globs_match_files(setuptools_config) -> None:
    for pkg, patterns in setuptools_config.get("package-data", {}).items():
        top, *sub = pkg.split(".")
        base = ROOT / FOLDERS_INVERSE[top] / Path(*sub)
        for pattern in patterns:
            assert list(base.glob(pattern)), f"package-data {pkg}: {pattern!r} matches nothing"


def test_console_script_target_exists() -> None:
    import importlib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, func = scripts["minisgl-chat"].split(":")
    assert module.split(".")[0] in FOLDERS.values()
    assert callable(getattr(importlib.import_module(module), func))


def test_built_wheel_holds_exactly_the_prefixed_packages(tmp_path) -> None:
    pytest.importorskip(
        "setuptools", reason="building the wheel offline needs setuptools in this environment"
    )
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, src / name)
    for folder in FOLDERS:
        shutil.copytree(
            ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"minisgl_engine", "minisgl_app"}
    # every source file and every package-data file made it in
    for folder, pkg in FOLDERS.items():
        for path in (ROOT / folder).rglob("*"):
            if (
                path.is_file()
                and "__pycache__" not in path.parts
                and path.suffix in (".py", ".json", ".css", ".js", ".png")
            ):
                assert f"{pkg}/{path.relative_to(ROOT / folder).as_posix()}" in names, path
    # the pages read their script and CSS from the installed package (app/page/scripts.py, css.py, access.py)
    for static in ("page.js", "page.css", "theme.css", "login.css", "favicon.png"):
        assert f"minisgl_app/static/{static}" in names, static

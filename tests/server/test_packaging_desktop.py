"""Desktop packaging (issue 4, items 7 and 8): the icon files, the CSS theme, the freedesktop
launcher, the AppStream metainfo and packaging/install.sh.

The validators come from Debian's desktop-file-utils (desktop-file-validate) and appstream
(appstreamcli); .ci/run installs both. Without them those tests skip and say so.
"""

from __future__ import annotations

import configparser
import os
import re
import shutil
import struct
import subprocess
import xml.etree.ElementTree as ET
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "assets"
STATIC = ROOT / "app" / "static"  # what the page itself serves (packaged with minisgl_app)
PACKAGING = ROOT / "packaging"
DESKTOP = PACKAGING / "minisgl-chat.desktop"
APP_ID = "io.github.minisgl.Chat"
METAINFO = PACKAGING / f"{APP_ID}.metainfo.xml"
INSTALL = PACKAGING / "install.sh"

PNG_SIZES = {"icon-256.png": 256, "icon-128.png": 128, "icon-48.png": 48, "favicon.png": 32}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SVG_NS = "{http://www.w3.org/2000/svg}"


def need(tool: str, package: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} not found: install Debian's {package} (apt-get install {package})")
    return path


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, **kw)


def appstream_version(appstreamcli: str) -> tuple[int, ...]:
    out = run([appstreamcli, "--version"]).stdout
    m = re.search(r"(\d+)\.(\d+)\.(\d+)", out)
    return tuple(int(x) for x in m.groups()) if m else (0, 0, 0)


def appstream_args(appstreamcli: str) -> list[str]:
    """The project has no public homepage yet. AppStream >= 1.0 reports a missing homepage URL as
    a warning, and allows exactly this tag to be lowered for such projects; 0.16 does not know
    the tag at all (and then must not be given the override)."""
    if appstream_version(appstreamcli) >= (1, 0, 0):
        return ["--override=url-homepage-missing=info"]
    return []


def assert_appstream_ok(result: subprocess.CompletedProcess) -> None:
    report = result.stdout + result.stderr
    assert result.returncode == 0, report
    bad = [line for line in report.splitlines() if re.match(r"\s*[EW]: ", line)]
    assert not bad, report


# ---- icons --------------------------------------------------------------------------------


def png_info(path: Path) -> dict:
    """Check a PNG's structure with the standard library: signature, chunk CRCs, an IHDR first,
    an IEND last, and IDAT data that inflates to exactly the size IHDR implies."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path.name}: not a PNG"
    pos, chunks, idat = 8, [], b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"{path.name}: bad CRC in {kind!r}"
        chunks.append(kind)
        if kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert chunks[0] == b"IHDR" and chunks[-1] == b"IEND", f"{path.name}: chunks {chunks}"
    ihdr = data[16:29]
    width, height, depth, colour, _comp, _filt, interlace = struct.unpack(">IIBBBBB", ihdr)
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[colour]
    if interlace == 0:
        row = 1 + (width * channels * depth + 7) // 8
        assert len(zlib.decompress(idat)) == row * height, f"{path.name}: truncated image data"
    return {"width": width, "height": height, "depth": depth, "colour": colour}


@pytest.mark.parametrize("name,size", sorted(PNG_SIZES.items()))
def test_png_icons_have_their_declared_size(name: str, size: int) -> None:
    info = png_info((STATIC if name == "favicon.png" else ASSETS) / name)
    assert (info["width"], info["height"]) == (size, size)
    assert info["colour"] == 6 and info["depth"] == 8, "expected 8-bit RGBA (transparent corners)"


def test_favicon_ico_holds_the_small_sizes() -> None:
    ico = ASSETS / "favicon.ico"
    if not ico.exists():
        pytest.skip("no favicon.ico (optional)")
    data = ico.read_bytes()
    reserved, kind, count = struct.unpack("<HHH", data[:6])
    assert (reserved, kind) == (0, 1) and count >= 1
    sizes = set()
    for i in range(count):
        w, h = data[6 + 16 * i], data[7 + 16 * i]
        size, offset = struct.unpack("<II", data[14 + 16 * i : 22 + 16 * i])
        assert offset + size <= len(data)
        sizes.add((w or 256, h or 256))
    assert {(16, 16), (32, 32)} <= sizes


def test_svg_icon_is_self_contained_with_a_square_viewbox() -> None:
    root = ET.parse(ASSETS / "icon.svg").getroot()
    assert root.tag == f"{SVG_NS}svg"
    assert root.get("viewBox", "").split() == ["0", "0", "256", "256"]
    tags = {el.tag.removeprefix(SVG_NS) for el in root.iter()}
    assert not tags & {"text", "image", "foreignObject", "script", "style"}, tags
    raw = (ASSETS / "icon.svg").read_text()
    assert "http://" not in raw.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in raw


def test_theme_css_styles_the_app_elements() -> None:
    css = (STATIC / "theme.css").read_text()
    body = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    assert body.count("{") == body.count("}")
    for selector in (
        "#chatbot",
        "#msg-input",
        "#send-btn",
        "#stop-btn",
        "#status-line",
        "#versions",
        ".thought-group",
        ".thinking",
        "#sidebar",
        "#conv-list",
    ):
        assert selector in body, selector
    assert "var(--body-text-color-subdued)" in body


# ---- desktop entry and metainfo -----------------------------------------------------------


def read_desktop(path: Path) -> dict[str, str]:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # keys are case-sensitive
    parser.read(path, encoding="utf-8")
    return dict(parser["Desktop Entry"])


def test_desktop_entry_declares_the_launcher() -> None:
    entry = read_desktop(DESKTOP)
    assert entry["Type"] == "Application"
    assert entry["Exec"] == "minisgl-chat"
    assert entry["Icon"] == "minisgl-chat"
    assert entry["Terminal"] == "false"
    assert entry["StartupNotify"] == "false"
    assert entry["Categories"].endswith(";")


def test_desktop_file_validate_passes() -> None:
    tool = need("desktop-file-validate", "desktop-file-utils")
    result = run([tool, str(DESKTOP)])
    report = result.stdout + result.stderr
    assert result.returncode == 0, report
    assert "error:" not in report and "warning:" not in report, report


def test_metainfo_matches_the_desktop_entry() -> None:
    root = ET.parse(METAINFO).getroot()
    assert root.tag == "component" and root.get("type") == "desktop-application"
    assert root.findtext("id") == APP_ID
    assert root.findtext("metadata_license") == "CC0-1.0"
    assert root.findtext("project_license") == "Apache-2.0"
    launchable = root.find("launchable")
    assert launchable is not None and launchable.get("type") == "desktop-id"
    assert launchable.text == DESKTOP.name
    assert root.findtext("provides/binary") == "minisgl-chat"
    assert root.find("content_rating").get("type") == "oars-1.1"
    release = root.find("releases/release")
    assert release.get("version") == "0.1.0" and release.get("date") == "2026-11-29"
    developer = root.find("developer")
    assert developer is not None and developer.get("id") and developer.findtext("name")


def test_appstreamcli_validate_passes() -> None:
    tool = need("appstreamcli", "appstream")
    result = run([tool, "validate", "--no-net", *appstream_args(tool), str(METAINFO)])
    assert_appstream_ok(result)


# ---- install.sh ---------------------------------------------------------------------------


def installed_paths(data: Path) -> dict[Path, Path]:
    """Installed file -> its source in the repository."""
    icons = data / "icons" / "hicolor"
    paths = {
        data / "applications" / "minisgl-chat.desktop": DESKTOP,
        data / "metainfo" / f"{APP_ID}.metainfo.xml": METAINFO,
        icons / "scalable" / "apps" / "minisgl-chat.svg": ASSETS / "icon.svg",
    }
    for size in (48, 128, 256):
        paths[icons / f"{size}x{size}" / "apps" / "minisgl-chat.png"] = ASSETS / f"icon-{size}.png"
    return paths


def run_install(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    result = run(["bash", str(INSTALL), *args], env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture()
def sandbox(tmp_path: Path) -> dict:
    """A HOME and XDG_DATA_HOME inside tmp_path, and a fake minisgl-chat first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "minisgl-chat"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    env = {
        "PATH": f"{bin_dir}{os.pathsep}/usr/local/bin{os.pathsep}/usr/bin{os.pathsep}/bin",
        "HOME": str(tmp_path / "home"),
        "XDG_DATA_HOME": str(tmp_path / "xdg-data"),
        "LANG": "C.UTF-8",
    }
    (tmp_path / "home").mkdir()
    return {"env": env, "fake": fake, "tmp": tmp_path}


def test_install_puts_every_file_in_place_and_uninstall_removes_them(sandbox) -> None:
    data = sandbox["tmp"] / "prefix" / "usr" / "share"
    expected = installed_paths(data)

    first = run_install("--prefix", str(data), env=sandbox["env"])
    for dst, src in expected.items():
        assert dst.is_file(), f"{dst} missing\n{first.stdout}"
        assert str(dst) in first.stdout, "install.sh says what it installed"
        if src != DESKTOP:
            assert dst.read_bytes() == src.read_bytes(), dst
    # --prefix wins over XDG_DATA_HOME, and nothing lands in HOME
    assert not Path(sandbox["env"]["XDG_DATA_HOME"]).exists()
    assert not any(Path(sandbox["env"]["HOME"]).iterdir())

    # the launcher runs the minisgl-chat found on PATH, by absolute path; the rest is unchanged
    desktop = data / "applications" / "minisgl-chat.desktop"
    entry = read_desktop(desktop)
    assert entry["Exec"] == str(sandbox["fake"])
    assert entry["TryExec"] == str(sandbox["fake"])
    source = read_desktop(DESKTOP)
    assert {k: v for k, v in entry.items() if k not in ("Exec", "TryExec")} == {
        k: v for k, v in source.items() if k not in ("Exec", "TryExec")
    }

    # idempotent: a second run succeeds and leaves the same files
    before = {p: p.read_bytes() for p in expected}
    run_install("--prefix", str(data), env=sandbox["env"])
    assert {p: p.read_bytes() for p in expected} == before
    assert not list(desktop.parent.glob(".minisgl-chat.desktop.*")), "temporary file left"

    if shutil.which("desktop-file-validate"):
        result = run(["desktop-file-validate", str(desktop)])
        assert result.returncode == 0 and "error:" not in result.stdout, result.stdout
    if shutil.which("appstreamcli"):
        # validate-tree also checks that the launchable's .desktop file is installed beside it
        tool = shutil.which("appstreamcli")
        tree = run(
            [
                tool,
                "validate-tree",
                "--no-net",
                *appstream_args(tool),
                str(sandbox["tmp"] / "prefix"),
            ]
        )
        assert_appstream_ok(tree)

    gone = run_install("--prefix", str(data), "--uninstall", env=sandbox["env"])
    for dst in expected:
        assert not dst.exists(), dst
        assert f"removed {dst}" in gone.stdout
    again = run_install("--prefix", str(data), "--uninstall", env=sandbox["env"])
    assert "removed" not in again.stdout


def test_install_defaults_to_xdg_data_home(sandbox) -> None:
    data = Path(sandbox["env"]["XDG_DATA_HOME"])
    run_install(env=sandbox["env"])
    for dst in installed_paths(data):
        assert dst.is_file(), dst
    run_install("--uninstall", env=sandbox["env"])
    for dst in installed_paths(data):
        assert not dst.exists(), dst


def test_install_without_xdg_data_home_uses_local_share(sandbox) -> None:
    env = dict(sandbox["env"])
    del env["XDG_DATA_HOME"]
    data = Path(env["HOME"]) / ".local" / "share"
    run_install(env=env)
    assert all(dst.is_file() for dst in installed_paths(data))
    run_install("--uninstall", env=env)
    assert not any(dst.exists() for dst in installed_paths(data))


def test_install_falls_back_to_the_checkout_venv(sandbox) -> None:
    env = dict(sandbox["env"])
    env["PATH"] = f"/usr/local/bin{os.pathsep}/usr/bin{os.pathsep}/bin"
    on_path = shutil.which("minisgl-chat", path=env["PATH"])
    venv_script = ROOT / ".venv" / "bin" / "minisgl-chat"
    if on_path:
        expected = on_path
    elif os.access(venv_script, os.X_OK):
        expected = str(venv_script)
    else:
        expected = "minisgl-chat"
    data = sandbox["tmp"] / "data"
    run_install("--prefix", str(data), env=env)
    assert read_desktop(data / "applications" / "minisgl-chat.desktop")["Exec"] == expected


def test_install_quotes_an_exec_path_with_spaces(sandbox) -> None:
    odd = sandbox["tmp"] / "my apps"
    odd.mkdir()
    script = odd / "minisgl-chat"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    env = dict(sandbox["env"])
    env["PATH"] = f"{odd}{os.pathsep}{env['PATH']}"
    data = sandbox["tmp"] / "data"
    run_install("--prefix", str(data), env=env)
    desktop = data / "applications" / "minisgl-chat.desktop"
    assert read_desktop(desktop)["Exec"] == f'"{script}"'
    if shutil.which("desktop-file-validate"):
        result = run(["desktop-file-validate", str(desktop)])
        assert result.returncode == 0 and "error:" not in result.stdout, result.stdout


def test_install_rejects_unknown_arguments(sandbox) -> None:
    result = run(["bash", str(INSTALL), "--bogus"], env=sandbox["env"])
    assert result.returncode != 0
    assert "unknown argument" in result.stderr

"""minisgl-chat's serving engine (import name ``minisgl_engine``).

Modules import strictly downward: plain data types (``sampling_params``, ``request``, ``batch``)
at the bottom, then ``kvcache`` and ``attention``, ``layers``, ``models``, ``engine``,
``scheduler`` and the offline ``llm`` API on top.
"""

"""The shipped patch sets, one folder each (patch.toml, its diffs, its probe).

This folder is installed as the package `dspark_patch.patches` (see setup.py), so the tool finds
the patch sets with importlib.resources wherever it is installed from: a wheel, an sdist or a
checkout. The file only makes the folder a regular package; nothing imports code from here.
"""

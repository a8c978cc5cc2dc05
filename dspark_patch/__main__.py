"""`python -m dspark_patch`: the console script, for an interpreter that has the package on its path
(a `pip install --target` folder beside an image's own packages, run with the image's python)."""

from .cli import main

main()

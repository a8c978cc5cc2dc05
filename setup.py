"""Only what pyproject.toml cannot say: patches/ stays at the top of the repository (the source
of truth for patch sets) and ships inside the package as `dspark_patch.patches`, in the wheel,
the sdist and the editable install alike."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["dspark_patch", "dspark_patch.*"]), "dspark_patch.patches"],
    package_dir={"dspark_patch.patches": "patches"},
)

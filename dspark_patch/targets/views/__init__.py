"""Read-only views of a site folder for `dspark-patch status`: a local folder (from_folder.py) or
an image's layer tars (from_layers.py), each filling in the same `SiteFiles` (site_files.py)
without running any code of the target."""

"""mkdocs-gen-files script: writes the generated reference pages and findings catalogue."""

import sys
from pathlib import Path

import mkdocs_gen_files

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout's own code

from docs_tools.pages import all_pages  # noqa: E402

for path, text in all_pages().items():
    with mkdocs_gen_files.open(path, "w") as f:
        f.write(text)
    mkdocs_gen_files.set_edit_path(path, "docs_tools/pages.py")

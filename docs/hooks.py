"""mkdocs hooks: the reference pages generated from the code, and the results and history pages in the nav.

`mkdocs build` calls on_config (nav) and on_files (pages); geotrain.cli.reference writes the pages.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

from geotrain.cli import reference

def _title(page: Path, colon: bool) -> str:
    """A page's nav title: its first heading, up to a parenthesis (and a colon where `colon`)."""
    heading = next((line for line in page.read_text().splitlines() if line.startswith("# ")), page.stem)
    heading = heading.removeprefix("# ")
    return (heading.split(":")[0] if colon else heading).split(" (")[0].strip("` ")


def on_config(config):
    docs = Path(config["docs_dir"])
    for section in config["nav"] or []:
        for name, folder in (("Results", "results"), ("History", "history")):
            if isinstance(section, dict) and name in section:
                section[name] += [{_title(page, colon=folder == "history"): f"{folder}/{page.name}"}
                                  for page in sorted((docs / folder).glob("*.md")) if page.name != "index.md"]
        if isinstance(section, dict) and "Reference" in section:
            section["Reference"].append({"Python API": [{module: f"reference/api/{module}.md"}
                                                        for module in reference.API_MODULES]})
    return config


def on_files(files, config):
    pages = {"reference/cli.md": reference.cli_markdown(),
             "reference/config.md": reference.config_markdown(),
             "reference/files.md": reference.files_markdown(),
             "reference/composition.md": reference.composition_markdown()}
    pages.update({f"reference/api/{name}": text for name, text in reference.api_pages().items()})
    for path, text in pages.items():
        files.append(File.generated(config, path, content=text))
    return files

"""Build a static website of the executed course: one HTML page per notebook and an index.

    python tools/build_site.py [--out site] [NAME ...]    # NAME: e.g. 01-why-scale

Every executed notebook in notebooks/ (``NN-*.ipynb``) becomes a
page through nbconvert's "lab" template. A page must read well without a kernel, so:

- each widget is shown as it was left when the notebook ran: the values of its controls in
  one line and the plot its output held (ipywidgets stores both in the notebook), with no
  JavaScript to load;
- exercise solutions (cells tagged ``solution``) sit folded under a "Solution" element;
- a widget with no static plot before it (since the previous widget) is reported: every
  notebook should also draw each widget's default plot statically;
- a link from one lesson to another (``[04](04-tensor-vs-pipeline.ipynb#...)``) points at
  that lesson's page, and the index renders each lesson's first paragraph as markdown.

The instructor guide (labs/README.md) becomes ``instructor-guide.html`` when it exists.
"""
from __future__ import annotations

import argparse
import copy
import html
import re
import sys
from pathlib import Path

import nbformat
from jinja2 import DictLoader
from nbconvert import HTMLExporter

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"

TEMPLATE = r"""
{%- extends 'lab/index.html.j2' -%}
{% block codecell %}
{%- if 'solution' in cell.metadata.get('tags', []) -%}
<details class="solution"><summary>Solution</summary>
{{ super() }}
</details>
{%- else -%}
{{ super() }}
{%- endif -%}
{% endblock codecell %}
{% block extra_css %}
<style>
details.solution { margin: 0.5em 0 0.5em 4em; padding: 0.3em 0.6em; border-left: 3px solid #55a868; }
details.solution summary { cursor: pointer; color: #2e7d32; font-weight: bold; }
.site-nav { font-family: sans-serif; padding: 0.6em 1em; border-bottom: 1px solid #ddd; }
.static-widget { font-family: monospace; font-size: 0.85em; color: #555; margin: 0.3em 0; }
</style>
{% endblock extra_css %}
{% block body_header %}
{{ super() }}
<nav class="site-nav">{{ resources.site_nav }}</nav>
{% endblock body_header %}
"""

INDEX = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: sans-serif; max-width: 46em; margin: 2em auto; line-height: 1.5; color: #222; }}
li {{ margin-bottom: 0.8em; }} .blurb {{ color: #555; font-size: 0.95em; }}
</style></head>
<body><h1>{title}</h1>
<p>Every lesson below was executed; plots and numbers are the ones the code produced.
To run them yourself: <code>make course</code> (JupyterLab) from the repository.</p>
<h2>Lessons</h2><ol>{lessons}</ol>{extra}
</body></html>
"""


# ---------------------------------------------------------------- notebooks in, pages out
def notebooks(names: list[str] | None = None) -> list[Path]:
    found = sorted(NOTEBOOKS.glob("[0-9][0-9]-*.ipynb"), key=lambda p: p.stem)
    if names:
        missing = [n for n in names if not any(p.stem == Path(n).stem for p in found)]
        if missing:
            raise ValueError(f"no notebook called {', '.join(missing)}; choose from "
                             f"{', '.join(p.stem for p in found)}")
        found = [p for p in found if p.stem in {Path(n).stem for n in names}]
    return found


def title_and_blurb(nb) -> tuple[str, str]:
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        heading = re.search(r"^#{1,3}\s+(.+)$", cell.source, re.M)
        if heading:
            after = cell.source[heading.end():].strip().split("\n\n")[0]
            blurb = " ".join(after.split())
            if len(blurb) > 300:    # cut between words, never inside a link or emphasis
                cut = blurb[:300].rsplit(" ", 1)[0]
                while cut.count("[") > cut.count("]") or cut.count("*") % 2 or cut.count("`") % 2:
                    cut = cut.rsplit(" ", 1)[0]
                blurb = cut + " ..."
            return heading.group(1).strip(), blurb
    return "", ""


def _control_text(state: dict) -> str | None:
    """'name = value' for one control of a widget, from its stored state."""
    name = state.get("description")
    if not name:
        return None
    if state.get("_options_labels") is not None and state.get("index") is not None:
        value = state["_options_labels"][state["index"]]
    else:
        value = state.get("value")
    return f"{name} = {value}"


def _widget_parts(model_id: str, models: dict, controls: list, outputs: list) -> None:
    """Walk a widget and its children: their control values and stored outputs."""
    model = models.get(model_id)
    if model is None:
        return
    state = model.get("state", {})
    if model.get("model_name") == "OutputModel":
        outputs += state.get("outputs", [])
    text = _control_text(state)
    if text and model.get("model_name") != "OutputModel":
        controls.append(text)
    for child in state.get("children", []):
        _widget_parts(child.removeprefix("IPY_MODEL_"), models, controls, outputs)


def freeze_widgets(nb) -> list[str]:
    """Replace each widget view by its controls' values and the outputs it stored.

    Returns a warning for each widget whose default plot would show nowhere without a
    running kernel: one that stored no plot of its own and has no static plot before it
    (since the previous widget). A widget that stored its plot needs no copy drawn again
    above it: one figure per idea."""
    models = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    warnings, seen_image = [], False
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        new_outputs = []
        for out in cell.get("outputs", []):
            view = out.get("data", {}).get(WIDGET_VIEW)
            if view is None:
                seen_image |= "image/png" in out.get("data", {})
                new_outputs.append(out)
                continue
            controls, stored = [], []
            _widget_parts(view["model_id"], models, controls, stored)
            note = ("Interactive in Jupyter; shown with " + ", ".join(controls)
                    if controls else "Interactive in Jupyter")
            new_outputs.append(nbformat.v4.new_output(
                "display_data", data={"text/html": f'<div class="static-widget">'
                                                   f'{html.escape(note)}</div>'}))
            new_outputs += [nbformat.from_dict(copy.deepcopy(o)) for o in stored]
            has_image = any("image/png" in o.get("data", {}) for o in stored)
            if not seen_image and not has_image:
                warnings.append(f"cell {index}: the widget stored no plot, and no static plot "
                                f"stands before it")
            seen_image = False
        cell.outputs = new_outputs
    nb.metadata.pop("widgets", None)       # nothing left for widget JavaScript to render
    return warnings


def executed(nb) -> bool:
    return any(c.get("outputs") for c in nb.cells if c.cell_type == "code")


def exporter() -> HTMLExporter:
    return HTMLExporter(template_name="lab", extra_loaders=[DictLoader({"site.j2": TEMPLATE})],
                        template_file="site.j2", embed_images=True)


def page_name(path: Path) -> str:
    return path.stem + ".html"


LESSON_LINK = re.compile(r'href="(\d\d-[\w-]+)\.ipynb(#[^"]*)?"')


def link_pages(body: str, built: set[str]) -> str:
    """``href="NN-name.ipynb#part"`` -> ``href="NN-name.html#part"`` for each lesson built."""
    return LESSON_LINK.sub(lambda m: f'href="{m[1]}.html{m[2] or ""}"'
                           if f"{m[1]}.html" in built else m[0], body)


def markdown_inline(text: str) -> str:
    """A lesson's blurb as HTML: links, emphasis and code rendered, no paragraph around it."""
    import mistune

    return mistune.html(text).strip().removeprefix("<p>").removesuffix("</p>")


def nav(pages: list[tuple[str, str]], guide: bool) -> str:
    """Links to every page, each named by its number (01, 04a, ...) with its title on hover."""
    links = ['<a href="index.html">Course</a>']
    links += [f'<a href="{name}" title="{html.escape(title)}">{name.split("-")[0]}</a>'
              for name, title in pages]
    links += ['<a href="instructor-guide.html">Instructor guide</a>'] if guide else []
    return " · ".join(links)


def guide_page(readme: Path) -> str:
    import mistune

    body = mistune.html(readme.read_text())
    return (f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>Instructor guide</title>'
            f'<style>body {{ font-family: sans-serif; max-width: 50em; margin: 2em auto; '
            f'line-height: 1.5; }} pre {{ background: #f5f5f5; padding: 0.6em; overflow-x: auto; }}'
            f' table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #ccc; '
            f'padding: 0.2em 0.5em; }}</style></head><body>'
            f'<p><a href="index.html">Course</a></p>{body}</body></html>')


def build(out: Path, names: list[str] | None = None, readme: Path | None = None) -> dict:
    """Write the site to ``out``; return {"pages": [...], "warnings": [...]}."""
    paths = notebooks(names)
    if not paths:
        raise ValueError(f"no executed notebooks in {NOTEBOOKS}")
    readme = readme if readme is not None else ROOT / "labs" / "README.md"
    out.mkdir(parents=True, exist_ok=True)
    books = [(p, nbformat.read(p, as_version=4)) for p in paths]
    titles = [(page_name(p), title_and_blurb(nb)[0] or p.stem) for p, nb in books]
    built = {name for name, _ in titles}
    site_nav = nav(titles, readme.exists())
    warnings, items = [], []
    for path, nb in books:
        if not executed(nb):
            warnings.append(f"{path.name}: not executed (no outputs); run tools/notebooks.py build")
        warnings += [f"{path.name}: {w}" for w in freeze_widgets(nb)]
        body, _ = exporter().from_notebook_node(
            nb, resources={"site_nav": site_nav, "metadata": {"name": path.stem}})
        (out / page_name(path)).write_text(link_pages(body, built))
        title, blurb = title_and_blurb(nb)
        items.append(f'<li><a href="{page_name(path)}">{html.escape(title or path.stem)}</a>'
                     f'<div class="blurb">{link_pages(markdown_inline(blurb), built)}</div></li>')
    extra = ""
    if readme.exists():
        (out / "instructor-guide.html").write_text(guide_page(readme))
        extra = ('<h2>For instructors</h2><p><a href="instructor-guide.html">The lab kit: '
                 'running every lab on a laptop, a GPU node or a SLURM cluster</a></p>')
    (out / "index.html").write_text(INDEX.format(title="Hands-on distributed training",
                                                 lessons="".join(items), extra=extra))
    return {"pages": [page_name(p) for p in paths], "warnings": warnings}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", help="notebooks to include (default: all)")
    p.add_argument("--out", type=Path, default=ROOT / "site")
    args = p.parse_args(argv)
    try:
        report = build(args.out, args.names)
    except ValueError as exc:
        p.error(str(exc))
    for w in report["warnings"]:
        print(f"warning: {w}", file=sys.stderr)
    print(f"{len(report['pages'])} pages + index.html in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The docs site (docs/, `make docs`): it builds with warnings as errors and nitpicky references; every public
class is in the API reference and every argument in its operator's generated table; every file of dags/ is
included somewhere; no internal link is broken; the README is the short front page with absolute links;
the release line (one version, a dated CHANGELOG release, true `version_added`). Screenshots of the built
home page and an operator guide, taken in headless Chromium, are kept in .artifacts/."""

from __future__ import annotations

import ast
import fcntl
import html
import importlib
import importlib.metadata
import inspect
import os
import pkgutil
import re
import shutil
import subprocess
import sys
import tomllib
import uuid
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

import airflow_volcano
from airflow_volcano.get_provider_info import get_provider_info

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
ARTIFACTS = REPO / ".artifacts"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
GITHUB = "https://github.com/airflow-volcano/airflow-volcano/blob/main/"
sys.path.insert(0, str(DOCS / "_ext"))
import argument_rows  # noqa: E402  (docs/_ext: the rows of the Sphinx extension's argument tables)

# Each class with an argument table, and the page it is on.
TABLES = {
    "airflow_volcano.operators.job.VolcanoJobOperator": "operators/job",
    "airflow_volcano.operators.pytorch.VolcanoPyTorchJobOperator": "operators/pytorch",
    "airflow_volcano.operators.deepspeed.VolcanoDeepSpeedJobOperator": "operators/deepspeed",
    "airflow_volcano.decorators.volcano_pytorch._VolcanoPyTorchDecoratedOperator": "operators/taskflow",
    "airflow_volcano.sensors.job.VolcanoJobSensor": "sensor",
}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """The site, built once per test run (the xdist workers share it, under a lock) as `make docs` does."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex
    root = tmp_path_factory.getbasetemp().parent if os.environ.get("PYTEST_XDIST_WORKER") \
        else tmp_path_factory.getbasetemp()
    out, log = root / f"docs-html-{run}", root / f"docs-build-{run}.log"
    with open(root / "docs-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "index.html").exists() and not log.exists():
            shutil.rmtree(DOCS / "_api", ignore_errors=True)  # the API pages are generated afresh
            done = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html",
                                   str(DOCS), str(out)], capture_output=True, text=True, cwd=REPO,
                                  env=dict(os.environ, PYTHONPATH=str(REPO)))
            log.write_text(f"exit {done.returncode}\n{done.stderr}")
    text = log.read_text()
    assert text.startswith("exit 0\n"), f"the docs build failed (warnings are errors):\n{text}"
    return out


def page(built: Path, name: str) -> str:
    return (built / f"{name}.html").read_text()


def test_the_docs_build_with_warnings_as_errors_and_nitpicky_references(built):
    assert (built / "index.html").exists() and (built / "api.html").exists()
    assert "airflow-volcano" in page(built, "index")


def public_classes() -> list[tuple[str, str]]:
    """(module, class) of every public class defined in a module of the package, but for the sitecustomize the
    pods run (importing it registers a signal handler and writes files: docs/conf.py leaves it out too)."""
    found = []
    for module_info in pkgutil.walk_packages(airflow_volcano.__path__, "airflow_volcano."):
        if module_info.name == "airflow_volcano.shell.stack_dumps":
            continue
        module = importlib.import_module(module_info.name)
        for name, value in vars(module).items():
            if inspect.isclass(value) and value.__module__ == module.__name__ and not name.startswith("_"):
                found.append((module.__name__, name))
    return found


def test_every_public_class_appears_in_the_api_reference(built):
    classes = public_classes()
    assert len(classes) > 40 and ("airflow_volcano.operators.pytorch", "VolcanoPyTorchJobOperator") in classes
    missing = [f"{module}.{name}" for module, name in classes
               if f'id="{module}.{name}"' not in page(built, f"_api/{module}")]
    assert not missing, f"not in the API reference: {missing}"


def shown_text(markup: str) -> str:
    """HTML as a reader sees its text: tags dropped, entities and typographic quotes undone, spaces collapsed."""
    text = html.unescape(re.sub(r"<[^>]+>", "", markup))
    return " ".join(text.translate(str.maketrans({"\u201c": '"', "\u201d": '"', "\u2019": "'", "\u2018": "'"})).split())


@pytest.mark.parametrize("path", TABLES, ids=lambda path: path.rsplit(".", 1)[1])
def test_every_argument_appears_in_its_operators_table_with_its_text(built, path):
    """Each argument's whole description (its declaration's doc text, through the `:param` lines) is in its row."""
    cls = argument_rows.import_object(path)
    text = page(built, TABLES[path])
    rows = argument_rows.arguments(cls)
    assert len(rows) >= (5 if cls.__name__ == "VolcanoJobSensor" else 50)
    for argument in rows:
        assert argument.doc, f"{argument.name}: no :param text"
        anchor = f'id="{argument_rows.anchor(cls, argument.name)}"'
        assert anchor in text, f"{cls.__name__}.{argument.name} has no row on {TABLES[path]}"
        row = shown_text(text[text.index(anchor):text.index("</tr>", text.index(anchor))])
        assert " ".join(argument.doc.replace("`", "").split()) in row, (
            f"{cls.__name__}.{argument.name}: its row does not read as its doc text:\n{row}")
    signature = {name for klass in cls.__mro__ if "__init__" in vars(klass) and klass.__module__.startswith(
        "airflow_volcano") for name in inspect.signature(vars(klass)["__init__"]).parameters} - {"self", "kwargs"}
    refused = set(getattr(cls, "refused_arguments", ()))
    assert signature - refused <= {argument.name for argument in rows}, "every argument of the signatures"


def test_no_page_lists_the_arguments_by_hand():
    """An argument's description is written once, in its declaration, and read in its table: a page's bullet list
    of arguments (`- `name` (default: ...): ...`) would say it a second time, and drift."""
    names = {argument.name for path in TABLES for argument in argument_rows.arguments(
        argument_rows.import_object(path))}
    listed = [f"{source.relative_to(REPO)}: {line.strip()[:80]}" for source in sorted(DOCS.rglob("*.md"))
              if "_build" not in source.parts for line in source.read_text().splitlines()
              if (bullet := re.match(r"\s*[-*] `(\w+)`", line)) and bullet.group(1) in names]
    assert not listed, "\n".join(listed)


def test_an_argument_without_a_param_line_fails_the_build(tmp_path):
    """The table's warning, which -W makes an error: a new argument cannot reach a release undocumented."""
    (tmp_path / "airflow_volcano_undocumented.py").write_text(
        'class Operator:\n    """An operator.\n\n    :param documented: has a text.\n    """\n\n'
        '    def __init__(self, *, documented: int = 1, forgotten: str = "x", **kwargs) -> None:\n        pass\n')
    (tmp_path / "conf.py").write_text(f"import sys\nsys.path[:0] = [{str(tmp_path)!r}, {str(DOCS / '_ext')!r}]\n"
                                      "extensions = ['argument_tables']\n")
    (tmp_path / "index.rst").write_text("Test\n====\n\n.. argument-table:: airflow_volcano_undocumented.Operator\n")
    done = subprocess.run([sys.executable, "-m", "sphinx", "-W", "-q", "-b", "html", str(tmp_path),
                           str(tmp_path / "out")], capture_output=True, text=True, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode != 0 and "Operator.forgotten has no :param line" in done.stderr, done.stderr


def test_the_pytorch_table_says_default_templating_and_where_an_argument_lands(built):
    text = html.unescape(re.sub(r"<[^>]+>", "", page(built, "operators/pytorch")))
    row = text[text.index("volcano_queue"):][:400]
    assert "str | None" in row and "default None" in row and "T (templated)" in row and "Job spec queue" in row, row


def literalincludes() -> dict[Path, list[Path]]:
    """Each docs page -> the files it includes with literalinclude."""
    found: dict[Path, list[Path]] = {}
    for source in sorted(DOCS.rglob("*.md")):
        if "_build" in source.parts:
            continue
        for target in re.findall(r"^```\{literalinclude\} (\S+)$", source.read_text(), re.MULTILINE):
            found.setdefault(source, []).append((source.parent / target).resolve())
    return found


def test_every_file_in_dags_is_included_somewhere():
    included = {path for paths in literalincludes().values() for path in paths}
    for paths in literalincludes().values():
        for path in paths:
            assert path.is_file(), path
    files = {path.resolve() for path in (REPO / "dags").rglob("*") if path.is_file() and "__pycache__" not in
             path.parts}
    assert files and not files - included, f"not included in any docs page: {sorted(map(str, files - included))}"


class Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(values["id"] or "")
        for key in ("href", "src"):
            if values.get(key) and tag in ("a", "img", "link", "script"):
                self.hrefs.append(values[key] or "")


def parsed(path: Path) -> Links:
    links = Links()
    links.feed(path.read_text())
    return links


def test_no_internal_link_of_the_built_site_is_broken(built):
    """Every relative link and image of every page resolves to a built file, and its #fragment to an id there."""
    pages = {path: parsed(path) for path in built.rglob("*.html")}
    broken = []
    for path, links in pages.items():
        for href in links.hrefs:
            parts = urlsplit(href)
            if parts.scheme or parts.netloc or href.startswith("mailto:"):
                continue
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{path.relative_to(built)}: {href}")
            elif parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else parsed(target).ids
                if unquote(parts.fragment) not in ids:
                    broken.append(f"{path.relative_to(built)}: {href} (no such anchor)")
    assert not broken, "\n".join(broken[:30])


def test_relative_links_of_the_markdown_pages_resolve():
    """A Markdown link to another file resolves from the page (Sphinx checks those to pages and anchors)."""
    broken = []
    for source in DOCS.rglob("*.md"):
        if "_build" in source.parts:
            continue
        text = re.sub(r"^```.*?^```", "", source.read_text(), flags=re.MULTILINE | re.DOTALL)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            parts = urlsplit(target)
            if parts.scheme or not parts.path:
                continue
            if not (source.parent / parts.path).exists():
                broken.append(f"{source.relative_to(REPO)}: {target}")
    assert not broken, broken


def test_the_readme_is_the_short_front_page_with_absolute_links():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    for heading in ("## Install", "## The two commands", "## Documentation"):
        assert heading in readme
    assert "make demo" in readme and "make test" in readme and "make docs" in readme
    assert "docs/_build/html/index.html" in readme and "-c " in readme
    targets = re.findall(r"\]\(([^)\s]+)\)", readme)
    assert targets and all(urlsplit(target).scheme == "https" for target in targets), "PyPI renders absolute links"
    for target in targets:
        if target.startswith(GITHUB):
            assert (REPO / target.removeprefix(GITHUB)).exists(), target


def test_the_first_dag_is_complete_and_builds_a_pytorch_task():
    """The README's DAG, which the getting started page includes from it."""
    from airflow.sdk import DAG

    assert (REPO / "README.md").resolve() in literalincludes()[DOCS / "getting-started.md"]
    code = re.search(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.DOTALL).group(1)
    assert 10 <= len(code.strip().splitlines()) <= 15
    ast.parse(code)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    dags = [value for value in scope.values() if isinstance(value, DAG)]
    assert len(dags) == 1 and [type(task).__name__ for task in dags[0].tasks] == ["VolcanoPyTorchJobOperator"]


def releases() -> list[str]:
    return re.findall(r"^## (\S+)", (REPO / "CHANGELOG.md").read_text(), re.MULTILINE)


def version_key(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def test_the_version_is_in_one_place_and_the_changelog_releases_it():
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert airflow_volcano.__version__ == importlib.metadata.version("airflow-volcano"), "read from the metadata"
    assert not re.search(r"^__version__ = [\"']", (REPO / "airflow_volcano" / "__init__.py").read_text(), re.M)
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert releases()[0] == "Unreleased" and releases()[1] == version
    assert re.search(rf"^## {re.escape(version)} - \d{{4}}-\d{{2}}-\d{{2}}$", changelog, re.MULTILINE), "dated"
    # What is merged after a release waits under Unreleased (docs/versioning.md), in the changelog's list form.
    unreleased = changelog.split("## Unreleased", 1)[1].split("\n## ", 1)[0]
    assert all(line.startswith(("- ", "  ")) for line in unreleased.strip().splitlines() if line.strip())


def test_every_config_options_version_added_is_a_release_up_to_this_one():
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    released = set(releases()[1:])
    for section in get_provider_info()["config"].values():
        for name, option in section["options"].items():
            assert option["version_added"] in released, name
            assert version_key(option["version_added"]) <= version_key(version), name


def test_screenshots_of_the_home_page_and_an_operator_guide(built):
    """What a reader sees, in Chromium: the site's title, and a row of the generated argument table."""
    from playwright.sync_api import expect, sync_playwright

    assert CHROMIUM.exists(), "Debian's chromium (make unit installs it)"
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            view = browser.new_page(viewport={"width": 1280, "height": 900})
            view.goto((built / "index.html").as_uri())
            expect(view.locator("h1").first).to_have_text(re.compile("airflow-volcano"))
            expect(view.get_by_role("link", name="VolcanoPyTorchJobOperator").first).to_be_visible()
            view.screenshot(path=str(ARTIFACTS / "docs-home.png"), full_page=False)
            view.goto((built / "operators" / "pytorch.html").as_uri())
            expect(view.locator("h1").first).to_have_text(re.compile("VolcanoPyTorchJobOperator"))
            worker_replicas = view.locator("#volcanopytorchjoboperator-worker-replicas")
            row = view.locator("table.argument-table tr", has=worker_replicas)
            expect(row).to_contain_text("number of workers")
            row.scroll_into_view_if_needed()
            view.screenshot(path=str(ARTIFACTS / "docs-operator-pytorch.png"), full_page=False)
        finally:
            browser.close()
    assert (ARTIFACTS / "docs-home.png").stat().st_size > 10_000

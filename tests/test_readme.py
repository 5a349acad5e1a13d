"""What the README and docs/ promise that code can check: the README's two commands and its length,
the runnable snippet and the map from the method to the code (docs/CODE.md), the flags tables
(the README's and docs/FLAGS.md), and that every link among them leads somewhere."""
import contextlib
import dataclasses
import io
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
FRONT_PAGE_LINES = 250  # the README is a front page: detail goes to docs/ (issue #48)


def _section(heading: str, text: str = README) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:end if end > 0 else None]


def _doc(name: str) -> str:
    return (ROOT / "docs" / name).read_text(encoding="utf-8")


def test_the_two_commands_come_first_and_ci_runs_the_test_command():
    commands = _section("## The two commands")
    assert "bash examples/scripts/quickstart_cpu.sh" in commands and "bash scripts/test.sh" in commands
    headings = re.findall(r"^## (.+)$", README, re.M)
    assert headings[0] == "The two commands", headings  # the first section after the introduction
    assert "bash scripts/test.sh" in (ROOT / ".ci/run").read_text()


def test_the_readme_stays_a_front_page():
    lines = README.count("\n")
    assert lines <= FRONT_PAGE_LINES, f"README.md has {lines} lines: move detail into docs/"


def test_the_replay_snippet_runs_as_printed(tmp_path, monkeypatch):
    code = re.search(r"```python\n(.*?)```", _section("## Using `replay/` on its own", _doc("CODE.md")), re.S).group(1)
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README snippet", "exec"), {})
    rows = [list(map(float, line.split())) for line in out.getvalue().splitlines()]
    assert [r[0] for r in rows] == [0, 1, 2, 3, 4]
    assert all(r[1] == 32 for r in rows)  # every fresh rollout, every step
    assert [r[2] for r in rows[:2]] == [0, 0] and all(r[2] == 16 for r in rows[2:])  # 0.5 x 32 after warm-up
    assert (tmp_path / "replay_state.npz").is_file()


def test_every_replay_flag_is_in_the_flags_table():
    from replay import ReplayConfig

    flags = _section("## Every replay flag", _doc("FLAGS.md"))
    missing = [f.name for f in dataclasses.fields(ReplayConfig) if f"`--replay.{f.name}`" not in flags]
    assert not missing, f"docs/FLAGS.md's table lacks {missing}"


def test_every_flag_the_readme_names_exists():
    from replay import ReplayConfig

    named = re.findall(r"`--replay\.(\w+)", _section("## The flags that matter"))
    assert len(named) >= 5
    unknown = sorted(set(named) - {f.name for f in dataclasses.fields(ReplayConfig)})
    assert not unknown, f"the README names flags that do not exist: {unknown}"


def test_every_name_in_the_map_from_method_to_code_is_defined_there():
    """In each cell, `path.py:name` names a file and something defined in it, a bare `name` one more
    in the last file, and a path without the folder is in the last file's folder."""
    table = _section("## Where each part of the method lives", _doc("CODE.md"))
    rows = [line for line in table.splitlines() if line.startswith("| ") and ".py" in line]
    assert len(rows) >= 10
    missing, path = [], None
    for cell in (line.split("|")[2] for line in rows):
        for token in re.findall(r"`([^`]+)`", cell):
            if ".py" in token:
                file, _, name = token.partition(":")
                path = ROOT / file if (ROOT / file).is_file() else path.parent / file
                if not path.is_file():
                    missing.append(token)
                    continue
            else:
                name = token
            leaf = name.split(".")[-1]
            if name and not re.search(rf"^\s*(def|class) {leaf}\b|^{leaf}\s*[:=]", path.read_text(), re.M):
                missing.append(f"{path.relative_to(ROOT)}:{name}")
    assert not missing, missing


# Files of other projects that docs/METHOD.md cites (the references it compares with): not here.
EXTERNAL = {"recipe/dapo/dapo_ray_trainer.py", "verl/utils/dataset/rl_dataset.py", "verl/trainer/ppo/rollout_recorder.py",
            "roll/pipeline/agentic/agentic_config.py", "roll/agentic/replay_buffer/trajectory_buffer.py",
            "priority_functions.py", "agentic_config.py",
            # ExGRPO (ElliottYan/LUFFY, ExGRPO/exgrpo/verl/verl/mix_src/) and LUFFY's loss
            "experience/experience_trainer_ops.py", "experience_trainer_ops.py", "experience/experience_helpers.py",
            "experience/experience_bucket_manager.py", "experience/weighted_bucket_sampler.py",
            "experience/experience_collate_fn.py", "mix_trainer_experience.py", "mix_core_alg.py",
            "verl/mix_src/mix_core_alg.py"}


def _defines(path: Path, name: str) -> bool:
    leaf = name.split(".")[-1]
    return bool(re.search(rf"^\s*(def|class) {leaf}\b|^\s*{leaf}\s*[:=]", path.read_text(), re.M))


def test_every_file_and_name_method_cites_is_defined_there():
    """Each `path.py:name` of docs/METHOD.md names a file of this repository and something defined
    in it. A path without its folder is in the folder of the last full path cited before it, else
    the one file of that name; the references' files (EXTERNAL) are not checked."""
    text = (ROOT / "docs/METHOD.md").read_text(encoding="utf-8")
    ours = [p.relative_to(ROOT) for p in ROOT.rglob("*.py") if p.relative_to(ROOT).parts[0] not in (".venv", "tests")]
    missing, folder, checked = [], ROOT, 0
    for file, name in re.findall(r"`([\w./]+\.py):([\w.]+)`", text):
        if file in EXTERNAL:
            continue
        same_name = [p for p in ours if p.name == file]
        path = next((p for p in (ROOT / file, folder / file) if p.is_file()),
                    ROOT / same_name[0] if len(same_name) == 1 else None)
        if path is None or not _defines(path, name):
            missing.append(f"{file}:{name}")
            continue
        folder, checked = path.parent, checked + 1
    assert checked >= 40 and not missing, missing


def _anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_of_the_readme_and_docs_leads_somewhere():
    """Each relative link of README.md and docs/*.md names a file or folder that exists, and an
    anchor into a markdown file names one of its headings (code blocks are not read)."""
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            headings = re.findall(r"^#+ (.+)$", dest.read_text(encoding="utf-8"), re.M) \
                if dest.suffix == ".md" and dest.is_file() else []
            if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in map(_anchor, headings)):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken

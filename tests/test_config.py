from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ocrd.config import ConfigError, PromptMode, load_config
from ocrd.config.checks import check_folders

REPO = Path(__file__).resolve().parents[1]


def ocrd(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ocrd", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


def write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_example_config_is_valid_and_derives_folders_beside_the_inbox() -> None:
    config = load_config(REPO / "config.example.yaml")
    inbox = config.inboxes[0]
    data = REPO / "data"
    assert (inbox.path, inbox.outbox, inbox.done, inbox.failed, inbox.work) == (
        data / "inbox",
        data / "outbox",
        data / "done",
        data / "failed",
        data / "work",
    )
    assert inbox.prompt is PromptMode.layout
    assert config.engine.kind == "auto"


def test_relative_paths_are_relative_to_the_config_file(tmp_path: Path) -> None:
    path = write(tmp_path, {"inboxes": [{"path": "in", "outbox": "/srv/out", "failed": "f"}]})
    inbox = load_config(path).inboxes[0]
    assert inbox.path == tmp_path / "in"
    assert inbox.outbox == Path("/srv/out")
    assert inbox.failed == tmp_path / "f"
    assert inbox.done == tmp_path / "done"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {"inboxes": [{"path": "in", "setle_seconds": 3}]},
            "inboxes[0].setle_seconds: unknown key",
        ),
        ({"inboxes": [{"path": "in"}], "engnie": {}}, "engnie: unknown key"),
        (
            {"inboxes": [{"path": "in", "dpi": "high"}]},
            "inboxes[0].dpi: Input should be a valid integer",
        ),
        (
            {"inboxes": [{"path": "in", "prompt": "fancy"}]},
            "inboxes[0].prompt: Input should be 'layout' or 'text'",
        ),
        (
            {"inboxes": [{"path": "in"}], "engine": {"kind": "tesseract"}},
            "engine.kind: Input should be",
        ),
        (
            {"inboxes": [{"path": "in"}], "engine": {"vllm": {"max_num_seqs": 0}}},
            "engine.vllm.max_num_seqs: Input should be greater than or equal to 1",
        ),
        ({"inboxes": []}, "inboxes: Tuple should have at least 1 item"),
        ({"inboxes": [{"path": "a/in"}, {"path": "a/other"}]}, "share the work folder"),
        (
            {"inboxes": [{"path": "in", "uploads": True, "recursive": False}]},
            "inboxes[0]: uploads: true needs recursive: true",
        ),
        (
            {"inboxes": [{"path": "in", "uploads": True, "collate": True}]},
            "uploads: true cannot be combined with collate: true",
        ),
        (
            {"inboxes": [{"path": "in", "uploads": True, "job_folders": ["up*"]}]},
            "job_folders matches the folder 'uploads'",
        ),
        (
            {"inboxes": [{"path": "in"}], "http": {"max_upload_mb": 0}},
            "http.max_upload_mb: Input should be greater than 0",
        ),
    ],
)
def test_errors_name_the_key_and_what_is_expected(
    tmp_path: Path, data: object, expected: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, data))
    assert expected in str(caught.value)


def test_check_config_exit_codes(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    good = write(tmp_path, {"inboxes": [{"path": "in"}]})
    result = ocrd("check-config", "--config", str(good))
    assert result.returncode == 0, result.stderr
    assert "OK" in result.stdout

    bad = tmp_path / "bad.yaml"
    bad.write_text("inboxes:\n  - path: in\n    polling: sometimes\n")
    result = ocrd("check-config", "--config", str(bad))
    assert result.returncode != 0
    assert "inboxes[0].polling" in result.stderr

    broken = tmp_path / "broken.yaml"
    broken.write_text("inboxes: [\n")
    result = ocrd("check-config", "--config", str(broken))
    assert result.returncode != 0
    assert "not valid YAML" in result.stderr


def test_output_inside_an_inbox_is_refused(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    config = load_config(write(tmp_path, {"inboxes": [{"path": "in", "outbox": "in/out"}]}))
    problems = check_folders(config, create=False)
    assert any("outbox folder" in p and "inside the watched inbox" in p for p in problems)


def test_daemon_refuses_to_start_with_one_clear_line(tmp_path: Path) -> None:
    path = write(tmp_path, {"inboxes": [{"path": "missing"}], "engine": {"kind": "simulated"}})
    result = ocrd("run", "--config", str(path), "--log-format", "json")
    assert result.returncode == 78
    lines = [line for line in result.stderr.splitlines() if "startup.refused" in line]
    assert len(lines) == 1
    assert f"inbox {tmp_path / 'missing'} does not exist" in lines[0]


def test_version() -> None:
    result = ocrd("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("ocrd, version ")


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        ("inboxes:\n  - path: in\n    setle_seconds: 3\n", "inboxes[0].setle_seconds: unknown key"),
        (
            "inboxes:\n  - path: in\npipeline:\n  rescan_interval_seconds: often\n",
            "pipeline.rescan_interval_seconds: Input should be a valid number",
        ),
        (
            "inboxes:\n  - path: in\n    pdf_lines: fast\n",
            "inboxes[0].pdf_lines: Input should be 'read', 'detect' or 'off'",
        ),
        ("inboxes: [\n", "not valid YAML"),
        (None, "cannot read the configuration file (No such file or directory)"),
        ("folder", "cannot read the configuration file (Is a directory)"),
    ],
    ids=["misspelt-key", "wrong-type", "wrong-pdf-lines", "not-yaml", "missing-file", "a-folder"],
)
def test_every_configuration_error_exits_78_naming_the_key_or_file(
    tmp_path: Path, written: str | None, expected: str
) -> None:
    """78 (EX_CONFIG) is what the unit's RestartPreventExitStatus= names: a configuration
    error stops the service instead of restarting it every 10 s forever."""
    (tmp_path / "in").mkdir()
    path = tmp_path / "config.yaml"
    if written == "folder":
        path.mkdir()
    elif written is not None:
        path.write_text(written)
    for command in (("check-config",), ("run", "--log-format", "json")):
        result = ocrd(*command, "--config", str(path))
        assert result.returncode == 78, (command, result.stderr)
        assert f"ocrd: {path}" in result.stderr and expected in result.stderr, result.stderr

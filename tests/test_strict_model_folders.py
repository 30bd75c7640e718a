"""StrictModes for model folders: a local `vllm.model`, `vllm.tokenizer` or
`layout.detector` that others than ocrd's user and root may change (the folder, a file or
folder in it, a link on the way, a folder above it) is refused by `ocrd check-config` and
`ocrd run` (exit 78, naming the setting, the folder, who may write it and what to do), and
a reload that names one keeps the configuration in use. Real folders, modes, ACLs, owners
(tests/users.py) and a real daemon (simulated engine); vLLM is never started: the refusal
comes before it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import write_config
from helpers import make_pdf
from users import PEOPLE, SERVICE, ensure_users, give, uid

from ocrd.config.strict_models import why_folder_unsafe

OUTSIDER = PEOPLE[0]
FILES = {
    "config.json": '{"model_type": "acme_ocr", "auto_map": {"AutoConfig": "acme.AcmeConfig"}}',
    "acme.py": "class AcmeConfig: ...\n",
    "tokenizer.json": "{}",
    "chat_template.jinja": "{{ messages }}",
    "vision/model.safetensors": "weights",
}


def ocrd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ocrd", *args], capture_output=True, text=True, timeout=120
    )


def model_folder(parent: Path) -> Path:
    """A model folder as `huggingface-cli download --local-dir` leaves one, root's alone."""
    folder = parent / "models" / "acme-ocr"
    for name, text in FILES.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
        (folder / name).chmod(0o644)
    for each in (parent / "models", folder, folder / "vision"):
        each.chmod(0o755)
    return folder


def hub_snapshot(parent: Path) -> Path:
    """A model as the hub's cache keeps it: a snapshot folder whose files link into blobs/."""
    repo = parent / "hub" / "models--acme--ocr"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    for number, name in enumerate(("config.json", "tokenizer.json", "model.safetensors")):
        blob = repo / "blobs" / f"blob{number}"
        blob.write_text(FILES.get(name, "weights"))
        (snapshot / name).symlink_to(Path("../../blobs") / blob.name)
    return snapshot


def vllm_config(folder: Path, model: Path, **vllm: Any) -> Path:
    return write_config(folder, engine={"kind": "vllm", "vllm": {"model": str(model), **vllm}})


def assert_refused(result: subprocess.CompletedProcess[str], setting: str, path: Path) -> None:
    assert result.returncode == 78, result.stderr
    refused = f"model folder ({setting}) {path} may be changed by others than root"
    assert refused in result.stderr
    assert f"chmod -R go-w {path}" in result.stderr


def test_a_model_folder_only_root_may_change_passes(tmp_path: Path) -> None:
    """The control: a local folder and a hub cache snapshot (links into blobs/), root's
    alone, with remote code trusted, and a hub name, are accepted."""
    folder, snapshot = model_folder(tmp_path), hub_snapshot(tmp_path)
    for model in (folder, snapshot):
        config = vllm_config(tmp_path, model, trust_remote_code=True, tokenizer=str(folder))
        checked = ocrd("check-config", "--config", str(config))
        assert checked.returncode == 0, checked.stderr
    hub_name = write_config(tmp_path, engine={"kind": "vllm", "vllm": {"model": "acme/ocr"}})
    assert ocrd("check-config", "--config", str(hub_name)).returncode == 0


def _group_writable_folder(folder: Path) -> str:
    folder.chmod(0o775)
    return f"{folder}: its group may write it"


def _world_writable_code(folder: Path) -> str:
    (folder / "acme.py").chmod(0o646)
    return f"{folder / 'acme.py'}: everyone may write it"


def _group_writable_weights_in_a_subfolder(folder: Path) -> str:
    (folder / "vision" / "model.safetensors").chmod(0o664)
    return f"{folder / 'vision' / 'model.safetensors'}: its group may write it"


def _writable_subfolder(folder: Path) -> str:
    (folder / "vision").chmod(0o757)
    return f"{folder / 'vision'}: everyone may write it"


def _folder_above_writable(folder: Path) -> str:
    folder.parent.chmod(0o757)
    return f"{folder.parent}, a folder on its way: everyone may write it"


def _tokenizer_linked_from_an_open_folder(folder: Path) -> str:
    """The file is root's, but the link to it lies in a folder anyone may write: whoever
    may write there points it elsewhere."""
    open_folder = folder.parent.parent / "open"
    open_folder.mkdir(mode=0o777)
    open_folder.chmod(0o757)
    (open_folder / "tokenizer.json").write_text("{}")
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.json").symlink_to(open_folder / "tokenizer.json")
    return f"{open_folder}, a folder on its way: everyone may write it"


UNSAFE: dict[str, Callable[[Path], str]] = {
    "group-writable-folder": _group_writable_folder,
    "world-writable-code": _world_writable_code,
    "group-writable-weights": _group_writable_weights_in_a_subfolder,
    "writable-subfolder": _writable_subfolder,
    "folder-above-writable": _folder_above_writable,
    "link-in-an-open-folder": _tokenizer_linked_from_an_open_folder,
}


@pytest.mark.parametrize("trust_remote_code", [True, False], ids=["remote-code", "weights"])
@pytest.mark.parametrize("make_unsafe", UNSAFE.values(), ids=UNSAFE.keys())
def test_a_model_folder_others_may_change_is_refused_by_check_config_and_run(
    tmp_path: Path, make_unsafe: Callable[[Path], str], trust_remote_code: bool
) -> None:
    """Refused with remote code (whoever may write it runs code as ocrd) and without it
    (whoever may write it decides what every page is read as)."""
    folder = model_folder(tmp_path)
    who = make_unsafe(folder)
    config = vllm_config(tmp_path, folder, trust_remote_code=trust_remote_code)

    for command in (("check-config",), ("run", "--log-format", "json")):
        result = ocrd(*command, "--config", str(config))
        assert_refused(result, "engine.vllm.model", folder)
        assert f"({who}" in result.stderr
        stake = "its Python files run as root" if trust_remote_code else "its weights, tokenizer"
        assert stake in result.stderr


def test_a_hub_snapshot_whose_blobs_others_may_write_is_refused(tmp_path: Path) -> None:
    snapshot = hub_snapshot(tmp_path)
    blob = snapshot.parent.parent / "blobs" / "blob2"
    blob.chmod(0o646)

    result = ocrd("check-config", "--config", str(vllm_config(tmp_path, snapshot)))

    assert_refused(result, "engine.vllm.model", snapshot)
    assert f"{blob}: everyone may write it" in result.stderr


@pytest.mark.users
def test_a_model_folder_another_user_owns_or_may_write_by_acl_is_refused(
    tmp_path: Path,
) -> None:
    ensure_users()
    folder = model_folder(tmp_path)
    give(folder / "config.json", OUTSIDER, 0o644)
    config = vllm_config(tmp_path, folder)

    owned = ocrd("check-config", "--config", str(config))

    assert_refused(owned, "engine.vllm.model", folder)
    assert f"{folder / 'config.json'}: it belongs to {OUTSIDER}" in owned.stderr

    os.chown(folder / "config.json", 0, 0)
    acl = f"user:{OUTSIDER}:rw"
    subprocess.run(["setfacl", "-m", acl, str(folder / "tokenizer.json")], check=True)
    by_acl = ocrd("check-config", "--config", str(config))

    assert_refused(by_acl, "engine.vllm.model", folder)
    assert f"its ACL lets user {OUTSIDER} write it" in by_acl.stderr


@pytest.mark.users
def test_a_model_folder_writable_by_its_owners_private_group_is_accepted(
    tmp_path: Path,
) -> None:
    """The service user's own folder, 0775 in its user private group, lets nobody else
    write (as for the configuration file); in root's group it does not."""
    ensure_users()
    folder = model_folder(tmp_path)
    give(folder, SERVICE, 0o775, group=SERVICE)
    assert why_folder_unsafe(folder, uid(SERVICE)) is None
    os.chown(folder, uid(SERVICE), 0)
    assert why_folder_unsafe(folder, uid(SERVICE)) == f"{folder}: its group may write it"


def test_each_models_folder_is_judged_only_where_its_engine_loads_one(tmp_path: Path) -> None:
    """`engine.models.<name>.vllm.model` is judged where that model's engine is vLLM, named
    by its setting; a remote (openai) engine loads no local folder, so nothing is judged;
    `ocrd run --engine vllm` judges the folders of the engine it makes."""
    folder = model_folder(tmp_path)
    folder.chmod(0o777)
    models = {"olmocr-2": {"kind": "vllm", "vllm": {"model": str(folder)}}}
    per_model = write_config(tmp_path, engine={"kind": "simulated", "models": models})

    result = ocrd("check-config", "--config", str(per_model))

    assert_refused(result, "engine.models.olmocr-2.vllm.model", folder)

    remote = write_config(tmp_path, engine={"kind": "openai", "vllm": {"model": str(folder)}})
    assert ocrd("check-config", "--config", str(remote)).returncode == 0

    simulated = {"kind": "simulated", "vllm": {"model": str(folder)}}
    config = write_config(tmp_path, engine=simulated)
    assert ocrd("check-config", "--config", str(config)).returncode == 0
    run = ocrd("run", "--engine", "vllm", "--config", str(config), "--log-format", "json")
    assert_refused(run, "engine.vllm.model", folder)


def test_a_missing_model_folder_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "models" / "gone"
    result = ocrd("check-config", "--config", str(vllm_config(tmp_path, missing)))
    assert result.returncode == 78, result.stderr
    assert f"model folder (engine.vllm.model) {missing} does not exist" in result.stderr


def test_a_layout_detector_others_may_change_is_refused_whatever_the_engine(
    tmp_path: Path,
) -> None:
    """The detector runs in ocrd's own processes before a model's engine of any kind: its
    weights decide which regions of every page are read."""
    folder = model_folder(tmp_path)
    (folder / "config.json").chmod(0o646)
    layout = {"detector": str(folder)}
    config = write_config(tmp_path, engine={"model": "glm-ocr", "layout": layout})

    result = ocrd("check-config", "--config", str(config))

    assert_refused(result, "engine.layout.detector", folder)
    assert "its weights decide which regions of every page are read" in result.stderr
    layout["detector"] = "published"  # the hub's: a name, not a folder
    published = write_config(tmp_path, engine={"model": "glm-ocr", "layout": layout})
    assert ocrd("check-config", "--config", str(published)).returncode == 0


def test_a_reload_naming_a_model_folder_others_may_change_keeps_the_old_config(
    tmp_path: Path, start_daemon: Any
) -> None:
    config = write_config(tmp_path)
    daemon = start_daemon(config)
    daemon.wait_for("daemon.ready")
    folder = model_folder(tmp_path)
    folder.chmod(0o757)

    data = yaml.safe_load(config.read_text())
    data["engine"]["layout"] = {"detector": str(folder)}
    data["inboxes"][0]["outbox"] = str(tmp_path / "elsewhere")
    config.write_text(yaml.safe_dump(data))
    daemon.process.send_signal(signal.SIGHUP)

    [failed] = daemon.wait_for("config.reload_failed")
    assert f"model folder (engine.layout.detector) {folder}" in failed["reason"]
    assert f"{folder}: everyone may write it" in failed["reason"]
    make_pdf(tmp_path / "data" / "inbox" / "letter.pdf", 1)
    daemon.wait_for("document.finished")
    assert (tmp_path / "data" / "outbox" / "letter.md").exists()  # the old outbox
    assert not (tmp_path / "elsewhere").exists()  # a refused configuration makes no folder
    assert daemon.stop() == 0

"""StrictModes for model folders, attacked as a member of the machine's groups would, who
wants ocrd to load their weights or code: a `..` after a link, a second name for the
service user's private group, a folder too big to look through, odd file names, an ACL's
mask, a model folder reached through a link, a relative name, and the service user's own
view of a folder it may not list. Real folders, links, ACLs and users (tests/users.py);
vLLM is never started: the refusal comes before it."""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import write_config
from test_strict_model_folders import assert_refused, model_folder, ocrd, vllm_config
from users import PEOPLE, SERVICE, Runtime, ensure_users, uid

from ocrd.config.strict_models import MAX_ENTRIES, why_folder_unsafe

OUTSIDER = PEOPLE[0]
ALONE = "ocrdalone"  # a user of these tests whose private group gets a second name
ALIAS = "ocrdalias"


def shared_folder(parent: Path) -> Path:
    """A team's share its group may write (setgid, as such shares are made)."""
    share = parent / "share"
    share.mkdir()
    os.chown(share, 0, grp.getgrnam("ocrdshare").gr_gid)
    share.chmod(0o2775)
    return share


@pytest.mark.users
def test_a_dot_dot_after_a_link_is_judged_where_the_kernel_leads(tmp_path: Path) -> None:
    """`/srv/models/current/../acme-ocr`, `current` a link into a share the group may
    write: the kernel loads the share's acme-ocr. Dropping `current/..` as written (abspath)
    judged the root-owned /srv/models/acme-ocr instead and let the share's in."""
    ensure_users()
    root_models = model_folder(tmp_path).parent  # tmp_path/models/acme-ocr, root's alone
    share = shared_folder(tmp_path)
    loaded = model_folder(share / "team")  # share/team/models/acme-ocr
    (loaded.parent / "v3").mkdir()
    (root_models / "current").symlink_to(loaded.parent / "v3")
    named = root_models / "current" / ".." / "acme-ocr"
    assert os.path.realpath(named) == str(loaded)

    result = ocrd("check-config", "--config", str(vllm_config(tmp_path, named)))

    assert_refused(result, "engine.vllm.model", named)
    assert f"{share}, a folder on its way: its group may write it" in result.stderr


@contextlib.contextmanager
def second_name_for_the_group_of(user: str, member: str) -> Iterator[None]:
    """`groupadd -o`: a second line in /etc/group with `user`'s private group's number,
    `member` in it. groupdel refuses a user's primary group's number, so the line is taken
    out of /etc/group and /etc/gshadow again by hand."""
    gid = grp.getgrnam(user).gr_gid
    subprocess.run(["groupadd", "-o", "-g", str(gid), ALIAS], check=True)
    try:
        subprocess.run(["usermod", "-aG", ALIAS, member], check=True)
        yield
    finally:
        for table in (Path("/etc/group"), Path("/etc/gshadow")):
            lines = table.read_text().splitlines(keepends=True)
            table.write_text("".join(x for x in lines if not x.startswith(f"{ALIAS}:")))


@pytest.mark.users
def test_a_private_group_with_a_second_name_others_are_in_is_not_private(
    tmp_path: Path,
) -> None:
    """A user's own folder 0775 in its private group is accepted while that group is
    theirs alone; a second name for the same group number with another user in it lets
    them write (the kernel goes by number), so it is refused."""
    ensure_users()
    if ALIAS in {group.gr_name for group in grp.getgrall()}:
        pytest.fail(f"group {ALIAS} is left from an earlier run; take it out of /etc/group")
    if ALONE not in {user.pw_name for user in pwd.getpwall()}:
        subprocess.run(["useradd", "--system", "--no-create-home", ALONE], check=True)
    folder = model_folder(tmp_path)
    os.chown(folder, uid(ALONE), grp.getgrnam(ALONE).gr_gid)
    folder.chmod(0o775)
    assert why_folder_unsafe(folder, uid(ALONE)) is None

    with second_name_for_the_group_of(ALONE, OUTSIDER):
        assert why_folder_unsafe(folder, uid(ALONE)) == f"{folder}: its group may write it"


def test_a_folder_with_more_entries_than_the_cap_is_refused_not_passed(tmp_path: Path) -> None:
    """The walk stops at MAX_ENTRIES: a folder holding one entry more is refused (what lies
    beyond the cap is never passed unseen); one at the cap is looked through and accepted."""
    folder = tmp_path / "models" / "many"
    folder.mkdir(parents=True)
    for number in range(MAX_ENTRIES):
        (folder / f"shard-{number:05}.safetensors").touch()
    assert why_folder_unsafe(folder, os.geteuid()) is None

    (folder / "zz-last.py").touch()
    (folder / "zz-last.py").chmod(0o666)
    result = ocrd("check-config", "--config", str(vllm_config(tmp_path, folder)))

    assert_refused(result, "engine.vllm.model", folder)
    assert f"it holds more than {MAX_ENTRIES} entries" in result.stderr


def test_a_file_named_with_a_newline_and_a_byte_not_utf8_is_named_not_a_crash(
    tmp_path: Path,
) -> None:
    folder = model_folder(tmp_path)
    odd = os.path.join(os.fsencode(folder), b"acme\n\xff.py")
    with open(odd, "w"):
        pass
    os.chmod(odd, 0o646)

    result = ocrd("check-config", "--config", str(vllm_config(tmp_path, folder)))

    assert_refused(result, "engine.vllm.model", folder)
    assert f"{folder}/acme\n\\udcff.py: everyone may write it" in result.stderr


@pytest.mark.users
def test_an_acl_mask_decides_whether_a_named_user_may_write(tmp_path: Path) -> None:
    """The kernel limits a named entry to the mask: `user:alice:rw` under `mask::r` lets
    alice read only (accepted); a mask that lets write through refuses it."""
    ensure_users()
    folder = model_folder(tmp_path)
    weights = folder / "vision" / "model.safetensors"
    subprocess.run(["setfacl", "-m", f"user:{OUTSIDER}:rw,mask::r", str(weights)], check=True)
    assert why_folder_unsafe(folder, os.geteuid()) is None

    subprocess.run(["setfacl", "-m", "mask::rw", str(weights)], check=True)
    why = why_folder_unsafe(folder, os.geteuid())
    assert why == f"{weights}: its ACL lets user {OUTSIDER} write it"


@pytest.mark.users
@pytest.mark.parametrize("where", ["folder-is-a-link", "parent-is-a-link"])
def test_a_model_folder_reached_through_a_link_into_a_share_is_refused(
    tmp_path: Path, where: str
) -> None:
    """The setting names a link (or a folder whose parent is one) into a share the group
    may write: whoever may write the share swaps what the link leads to."""
    ensure_users()
    share = shared_folder(tmp_path)
    real = model_folder(share)  # share/models/acme-ocr
    links = tmp_path / "links"
    links.mkdir(mode=0o755)
    if where == "folder-is-a-link":
        (links / "acme-ocr").symlink_to(real)
        named = links / "acme-ocr"
    else:
        (links / "models").symlink_to(real.parent)
        named = links / "models" / "acme-ocr"

    result = ocrd("check-config", "--config", str(vllm_config(tmp_path, named)))

    assert_refused(result, "engine.vllm.model", Path(f"{named}"))
    assert f"{share}, a folder on its way: its group may write it" in result.stderr


def test_a_relative_name_that_exists_from_the_working_folder_is_judged(tmp_path: Path) -> None:
    """vLLM takes `models/acme-ocr` as a folder where one exists from its working folder
    (else as a hub name): judged there, named by its full path; the same folder made
    root's alone is accepted."""
    folder = model_folder(tmp_path)
    config = write_config(tmp_path, engine={"kind": "vllm", "vllm": {"model": "models/acme-ocr"}})
    (folder / "acme.py").chmod(0o646)
    command = [sys.executable, "-m", "ocrd", "check-config", "--config", str(config)]

    refused = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)

    assert_refused(refused, "engine.vllm.model", folder)
    (folder / "acme.py").chmod(0o644)
    accepted = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert accepted.returncode == 0, accepted.stderr


@pytest.mark.users
def test_as_the_service_user_a_folder_it_may_not_list_is_refused(
    shared_root: Path, runtime: Runtime
) -> None:
    """ocrd's user judges a root-owned /opt/models-like folder (accepted), but cannot look
    into a root-owned subfolder 0711 that hides a file anyone may write: refused as a
    folder that cannot be looked at, never passed for want of a listing."""
    shared_root.chmod(0o755)
    folder = model_folder(shared_root)
    code = (
        "import sys; from pathlib import Path; "
        "from ocrd.config.strict_models import why_folder_unsafe; "
        f"print(why_folder_unsafe(Path(sys.argv[1]), {uid(SERVICE)}))"
    )

    def judged() -> str:
        result = runtime.run_as_service([runtime.python, "-c", code, str(folder)])
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    assert judged() == "None"
    hidden = folder / "hidden"
    hidden.mkdir()
    (hidden / "processor.py").write_text("")
    (hidden / "processor.py").chmod(0o646)
    hidden.chmod(0o711)
    assert judged() == f"{hidden} cannot be looked at (Permission denied)"

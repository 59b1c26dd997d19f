"""`.ci/arm64_check.py` takes Debian's arm64 packages from the archive this machine's apt
configuration names (deb822 `.sources` and one-line `sources.list`), never from a host of
its own."""

import importlib.util

import pytest

from conftest import REPO


def arm64_check():
    spec = importlib.util.spec_from_file_location("arm64_check", REPO / ".ci" / "arm64_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_debian_archive_comes_from_apts_sources(tmp_path):
    check = arm64_check()
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "other.sources").write_text(
        "Types: deb\nURIs: file:/srv/node\nSuites: nodistro\nComponents: main\n\n"
        "Types: deb-src\nURIs: file:/srv/b/debian\nSuites: bookworm\nComponents: main\n")
    (tmp_path / "sources.list").write_text(
        "# a comment\ndeb [arch=amd64 signed-by=/k.gpg] file:/srv/c/debian/ bookworm "
        "contrib main\n")
    assert check.mirror(tmp_path) == "file:/srv/c/debian"
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\n# a comment\nURIs: file:/srv/d/debian\nSuites: bookworm "
        "bookworm-updates\nComponents: main\n")
    assert check.mirror(tmp_path) == "file:/srv/d/debian"  # .sources are read first


def test_no_bookworm_source_is_a_skip_with_its_reason(tmp_path, capsys):
    check = arm64_check()
    (tmp_path / "sources.list").write_text("deb file:/srv/c/debian trixie main\n")
    with pytest.raises(SystemExit) as exit_:
        check.mirror(tmp_path)
    assert exit_.value.code == check.SKIP
    assert "no apt source of this machine serves Debian bookworm main" in capsys.readouterr().err

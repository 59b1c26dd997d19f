"""The input rule of `generate` (#56): a prompt file is a regular file of bounded size, checked
before it is opened (a FIFO, /dev/zero behind a symlink and a 100 MB sparse file ran until
killed); a prompt that is not UTF-8, an empty stop string and a vanishing temperature end in one
line or in the right tokens, never a traceback or NaN."""

import json
import os

import pytest

from conftest import cli

SESSION_TIMEOUT = 60  # every refusal comes before any generation: far below this


def prompt_file(kind: str, root):
    path = root / "prompt"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    elif kind == "sparse":
        with open(path, "wb") as f:
            f.truncate(100 << 20)
    else:
        path.mkdir()
    return path


@pytest.mark.parametrize("kind,message", [
    ("fifo", "is not a regular file"), ("device", "is not a regular file"),
    ("sparse", "more than the 67,108,864 a prompt may"), ("folder", "is a directory")])
def test_a_prompt_file_that_is_not_a_bounded_regular_file_is_refused(artifacts, tmp_path,
                                                                     kind, message):
    path = prompt_file(kind, tmp_path)
    result = cli("generate", artifacts["onnx"], "--prompt-file", path, "-n", "2",
                 timeout=SESSION_TIMEOUT)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_odd_prompts_and_options_end_cleanly(artifacts):
    bad = cli("generate", artifacts["onnx"], "--prompt", "A\udcff", "-n", "2")
    assert bad.returncode == 2 and "the prompt is not UTF-8 text" in bad.stderr, bad.stderr
    empty = cli("generate", artifacts["onnx"], "--prompt", "ABC", "--stop", "", "-n", "2")
    assert empty.returncode == 2 and "--stop takes a non-empty string" in empty.stderr
    runs = [json.loads(cli("generate", artifacts["onnx"], "--prompt-ids", "5,9,33,5,9", "-n",
                           "8", *extra, "--json").stdout)["tokens"]
            for extra in ([], ["--temperature", "1e-320", "--seed", "3"])]
    assert runs[0] == runs[1]  # a vanishing temperature samples the greedy token

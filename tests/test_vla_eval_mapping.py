"""A hostile ``--vla-eval-mapping``: huge, deep, of the wrong types, or a path that is no file.

Each is a :class:`MappingFileError` naming what is wrong, read no further than the mapping's bound, and
``cosmos3-serve`` refuses it at start with exit 2 and one line on stderr, before anything starts.
"""

from __future__ import annotations

import json
import os

import pytest

from policy_server.assembly.cli import main
from policy_server.foundation.mapping_files import MAX_MAPPING_BYTES
from policy_server.vla_eval.translation import MappingFileError, ObservationMapping

pytestmark = pytest.mark.timeout(60)


def nested(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize(
    ("text", "refused"),
    [
        ('{"unused": [' + ", ".join(['"k"'] * 40_000) + "]}", "larger than 64 KiB"),
        ('{"observation_params": {"a": ' + nested(30_000) + "}}", "nested too deeply"),
        ('{"observation_params": {"a": ' + nested(9) + "}}", "nests deeper than 8"),
        ('{"unused": [' + ", ".join(f'"k{i}"' for i in range(65)) + "]}", "at most 64 keys"),
        ('{"prompt": ["' + "p" * 300 + '"]}', "at most 256 characters"),
        ('{"state": [1, 2]}', "state must be a list of keys"),
        ('{"cameras": {"wrist_view": 5}}', "cameras.wrist_view"),
        ('{"cameras": ["front"]}', "`cameras` must map"),
        ('{"observation_params": [1]}', "`observation_params` must be an object"),
    ],
)
def test_a_hostile_mapping_is_refused_naming_what_is_wrong(tmp_path, text, refused):
    path = tmp_path / "mapping.json"
    path.write_text(text)
    for source in (str(path), text):
        with pytest.raises(MappingFileError, match=refused.replace("[", r"\[")):
            ObservationMapping.load(source)


def test_a_mapping_at_its_bounds_is_accepted(tmp_path):
    mapping = {
        "unused": [f"{i:0256d}" for i in range(64)],
        "observation_params": {"a": json.loads(nested(7))},
    }
    text = json.dumps(mapping)
    assert len(text) <= MAX_MAPPING_BYTES
    loaded = ObservationMapping.load(text)
    assert len(loaded.unused) == 64 and loaded.observation_params == mapping["observation_params"]


def test_a_mapping_path_that_is_no_regular_file_is_refused_without_reading_it(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # a plain open would wait for a writer forever
    for path, refused in (
        (fifo, "not a regular file"),
        ("/dev/zero", "not a regular file"),
        (tmp_path, "not a regular file|Is a directory"),
    ):
        with pytest.raises(MappingFileError, match=refused):
            ObservationMapping.load(str(path))
    with pytest.raises(MappingFileError, match="cannot read"):
        ObservationMapping.load(str(tmp_path / "missing.json"))


def test_cosmos3_serve_refuses_a_hostile_mapping_at_start_with_one_line(tmp_path, capsys):
    path = tmp_path / "mapping.json"
    path.write_text('{"observation_params": ' + nested(30_000) + "}")
    with pytest.raises(SystemExit) as exit_info:
        main(["--tiny", "distilled", "--vla-eval-mapping", str(path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"cosmos3-serve: error: {path} is nested too deeply to be a mapping"], err

"""One loader reads both operator mapping files (openpi's camera mapping, vla-eval's observation mapping),
bounded before it parses: a hostile file is refused the same way by each."""

from __future__ import annotations

import os

import pytest

from policy_server.foundation.mapping_files import MAX_MAPPING_BYTES
from policy_server.openpi_settings import CameraMapping, CameraMappingError
from policy_server.vla_eval.translation import MappingFileError, ObservationMapping

LOADERS = [(CameraMapping.load, CameraMappingError), (ObservationMapping.load, MappingFileError)]


@pytest.mark.parametrize(("load", "error"), LOADERS)
def test_each_mapping_refuses_a_hostile_file_before_parsing_it(tmp_path, load, error):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # a plain open would wait for a writer forever
    with pytest.raises(error, match="not a regular file"):
        load(str(fifo))
    with pytest.raises(error, match="not a regular file"):
        load("/dev/zero")
    big = tmp_path / "big.json"
    big.write_text('{"x": "' + "y" * MAX_MAPPING_BYTES + '"}')
    with pytest.raises(error, match="larger than 64 KiB"):
        load(str(big))
    deep = '{"x": ' + "[" * 30_000 + "]" * 30_000 + "}"
    for source in (deep, _file(tmp_path, deep)):
        with pytest.raises(error, match="nested too deeply"):
            load(source)
    with pytest.raises(error, match="not valid JSON"):
        load("{not json")
    with pytest.raises(error, match="must be a JSON object"):
        load(_file(tmp_path, "[1, 2]"))


def _file(tmp_path, text: str) -> str:
    path = tmp_path / "mapping.json"
    path.write_text(text)
    return str(path)

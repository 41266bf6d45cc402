"""The page headers of a Parquet column chunk, read before any page is decompressed.

A Parquet reader sizes each page it decompresses by the ``uncompressed_page_size`` of the page's own header
(Thrift's compact protocol, in front of the page), not by the footer, so a 33 kB file can hold a dictionary
page that decompresses to a gigabyte. :func:`column_pages` walks a column chunk's headers, skipping each
page's bytes, and returns what each page will take once decoded and how many values it holds; the dataset
reader bounds those before it asks pyarrow for a row.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

MAX_HEADER_BYTES = 64 * 2**10  # a page header is tens of bytes; page statistics are capped at 4 kB by writers
MAX_DEPTH = 8  # struct nesting inside a page header (PageHeader > DataPageHeader > Statistics)
# parquet.thrift's PageType
DICTIONARY_PAGE = 2
# PageHeader's fields: the sizes, and the header of each kind of page, whose field 1 is its num_values.
_UNCOMPRESSED, _COMPRESSED = 2, 3
_VALUE_HEADERS = (5, 7, 8)  # DataPageHeader, DictionaryPageHeader, DataPageHeaderV2


class PageHeaderError(ValueError):
    """A page header that cannot be read within the bounds, or that leaves its column chunk."""


@dataclass(frozen=True)
class PageSize:
    """One page of a column chunk, from its header."""

    kind: int  # parquet.thrift's PageType: 0 data, 2 dictionary, 3 data v2
    uncompressed_bytes: int
    compressed_bytes: int
    values: int  # num_values of its data or dictionary page header


def column_pages(handle: BinaryIO, start: int, length: int) -> Iterator[PageSize]:
    """The pages of the column chunk at ``start`` spanning ``length`` bytes (its footer's offsets), in order."""
    at, end = start, start + length
    while at < end:
        handle.seek(at)
        window = handle.read(min(MAX_HEADER_BYTES, end - at))
        reader = _Compact(window)
        fields = reader.struct(0)
        kind, uncompressed, compressed = (_count(fields.get(k)) for k in (1, _UNCOMPRESSED, _COMPRESSED))
        inner = next((header for k in _VALUE_HEADERS if isinstance(header := fields.get(k), dict)), {})
        values = _count(inner.get(1, 0))
        if min(kind, uncompressed, compressed, values) < 0:
            raise PageHeaderError(f"a page header at byte {at} lacks its type, sizes or value count")
        at += reader.at + compressed
        if at > end:
            raise PageHeaderError(f"a page at byte {at - compressed} runs past its column chunk")
        yield PageSize(kind, uncompressed, compressed, values)


def _count(value: object) -> int:
    """A header's whole number, or -1 where it has none."""
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


class _Compact:
    """Thrift's compact protocol, enough to read a struct's integer fields and skip everything else."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def byte(self) -> int:
        if self.at >= len(self.data):
            raise PageHeaderError(f"a page header longer than {MAX_HEADER_BYTES:,} bytes or cut short")
        value = self.data[self.at]
        self.at += 1
        return value

    def varint(self) -> int:
        value, shift = 0, 0
        while True:
            b = self.byte()
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 63:
                raise PageHeaderError("a page header's integer is longer than 64 bits")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def skip_bytes(self, count: int) -> None:
        if count < 0 or self.at + count > len(self.data):
            raise PageHeaderError(f"a page header longer than {MAX_HEADER_BYTES:,} bytes or cut short")
        self.at += count

    def value(self, kind: int, depth: int) -> object:
        """A value of compact type ``kind``: integers returned, a struct as its fields, anything else skipped."""
        if kind in (1, 2):  # a bool inside a list (in a field, the field header holds it)
            return self.byte() == 1
        if kind == 3:
            return self.byte()
        if kind in (4, 5, 6):
            return self.zigzag()
        if kind == 7:
            self.skip_bytes(8)
        elif kind == 8:
            self.skip_bytes(self.varint())
        elif kind in (9, 10):
            header = self.byte()
            size, element = header >> 4, header & 0x0F
            size = self.varint() if size == 15 else size
            for _ in range(size):
                self.value(element, depth + 1)
        elif kind == 11:
            size = self.varint()
            if size:
                types = self.byte()
                for _ in range(size):
                    self.value(types >> 4, depth + 1)
                    self.value(types & 0x0F, depth + 1)
        elif kind == 12:
            return self.struct(depth + 1)
        else:
            raise PageHeaderError(f"a page header holds an unknown Thrift type {kind}")
        return None

    def struct(self, depth: int) -> dict[int, object]:
        if depth > MAX_DEPTH:
            raise PageHeaderError(f"a page header nests deeper than {MAX_DEPTH} structs")
        fields: dict[int, object] = {}
        last = 0
        while True:
            header = self.byte()
            kind = header & 0x0F
            if kind == 0:
                return fields
            delta = header >> 4
            last = last + delta if delta else self.zigzag()
            fields[last] = (kind == 1) if kind in (1, 2) else self.value(kind, depth)

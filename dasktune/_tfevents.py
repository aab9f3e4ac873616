"""TensorBoard event records, encoded straight into protobuf wire format.

Why this exists: tensorboardX's package ``__init__`` imports ``torch`` when torch is
installed, and every ``tensorboardX.*`` submodule runs that ``__init__`` first, so even
its generated ``event_pb2`` costs seconds of CPU per driver process. The few messages
a tuning run writes (the file-version event, scalar events and the hparams plugin's
three summaries) are small enough to encode by hand, byte-for-byte as tensorboardX's
``Event(...).SerializeToString()`` and ``tensorboardX.summary.hparams`` produce them
(but for the hparams map, written in insertion order where protobuf uses hash order).

Field numbers are those of TensorBoard's ``event.proto``, ``summary.proto``,
``plugins/hparams/api.proto`` and ``plugins/hparams/plugin_data.proto``. Proto3 rules
apply: scalar fields at their default value are left out, members of a ``oneof`` and
sub-messages are always written once set.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterable, Mapping

__all__ = [
    "crc32c", "masked_crc32c", "tf_record", "event", "file_version_event", "scalars_event",
    "hparams_summaries",
]

# --------------------------------------------------------------------------- CRC-32C

_CRC_TABLE: list[int] = []
for _n in range(256):
    _c = _n
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1  # Castagnoli, reflected
    _CRC_TABLE.append(_c)
del _n, _c


def _crc32c_py(data: bytes) -> int:
    """CRC-32C of ``data``, table-driven; the fallback when no C implementation is there."""
    crc = 0xFFFFFFFF
    table = _CRC_TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


_crc32c_c: Callable[[bytes], int] | None
try:  # the ``crc32c`` package (hardware-accelerated) when installed; pure Python otherwise
    from crc32c import crc32c as _crc32c_c
except ImportError:  # pragma: no cover - depends on the environment
    _crc32c_c = None


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of ``data``."""
    if _crc32c_c is not None:
        return int(_crc32c_c(data))
    return _crc32c_py(data)


def masked_crc32c(data: bytes) -> int:
    """The TFRecord checksum: CRC-32C rotated right by 15 bits plus a constant."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tf_record(data: bytes) -> bytes:
    """``data`` framed as one TFRecord: length, its masked CRC, data, data's masked CRC."""
    header = struct.pack("<Q", len(data))
    return b"".join((header, struct.pack("<I", masked_crc32c(header)), data,
                     struct.pack("<I", masked_crc32c(data))))


# --------------------------------------------------------------------------- wire format

def _varint(value: int) -> bytes:
    """Base-128 varint; negative values as 64-bit two's complement (int64/enum fields)."""
    if value < 0:
        value += 1 << 64
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _len_field(tag: int, payload: bytes) -> bytes:
    """A length-delimited field; ``tag`` is the pre-encoded key byte (field number < 16)."""
    return bytes((tag,)) + _varint(len(payload)) + payload


def _str_field(tag: int, text: str) -> bytes:
    """A proto3 string field: left out when empty."""
    return _len_field(tag, text.encode("utf-8")) if text else b""


_pack_float = struct.Struct("<f").pack
_pack_double = struct.Struct("<d").pack


def _float32(value: float) -> bytes:
    """``value`` as a little-endian float, overflowing to +-inf as protobuf's C cast does."""
    try:
        return _pack_float(value)
    except OverflowError:
        return _pack_float(math.copysign(math.inf, value))


# Keys (field_number << 3 | wire_type) of the fields written below.
_EV_WALL_TIME = 0x09      # Event.wall_time = 1, double
_EV_STEP = 0x10           # Event.step = 2, int64
_EV_FILE_VERSION = 0x1A   # Event.file_version = 3, string
_EV_SUMMARY = 0x2A        # Event.summary = 5, Summary
_SUM_VALUE = 0x0A         # Summary.value = 1, repeated Value
_VAL_TAG = 0x0A           # Summary.Value.tag = 1, string
_VAL_SIMPLE = 0x15        # Summary.Value.simple_value = 2, float
_VAL_METADATA = 0x4A      # Summary.Value.metadata = 9, SummaryMetadata
_MD_PLUGIN_DATA = 0x0A    # SummaryMetadata.plugin_data = 1; PluginData.plugin_name = 1
_PD_CONTENT = 0x12        # PluginData.content = 2, bytes

_NO_DOUBLE = bytes(8)


def event(wall_time: float, step: int = 0, summary: bytes | None = None,
          file_version: str | None = None) -> bytes:
    """A serialized ``Event``; ``summary`` is a serialized ``Summary``."""
    parts = []
    wall = _pack_double(wall_time)
    if wall != _NO_DOUBLE:  # proto3 leaves out 0.0 (but not -0.0)
        parts.append(bytes((_EV_WALL_TIME,)) + wall)
    if step:
        parts.append(bytes((_EV_STEP,)) + _varint(step))
    if file_version is not None:  # oneof member: written even when empty
        parts.append(_len_field(_EV_FILE_VERSION, file_version.encode("utf-8")))
    if summary is not None:
        parts.append(_len_field(_EV_SUMMARY, summary))
    return b"".join(parts)


def file_version_event(wall_time: float) -> bytes:
    """The first event of every events file."""
    return event(wall_time, file_version="brain.Event:2")


# Everything of a scalar's Summary.Value but its 4 value bytes, per tag: tags repeat in
# every result of a run, and this is most of the encoding's cost.
_scalar_prefixes: dict[str, bytes] = {}
_MAX_CACHED_TAGS = 10_000


def _scalar_prefix(tag: str) -> bytes:
    prefix = _scalar_prefixes.get(tag)
    if prefix is None:
        head = _str_field(_VAL_TAG, tag) + bytes((_VAL_SIMPLE,))
        prefix = bytes((_SUM_VALUE,)) + _varint(len(head) + 4) + head
        if len(_scalar_prefixes) < _MAX_CACHED_TAGS:
            _scalar_prefixes[tag] = prefix
    return prefix


def scalars_event(wall_time: float, step: int, scalars: Iterable[tuple[str, float]]) -> bytes:
    """An ``Event`` whose summary holds one ``simple_value`` per ``(tag, value)``."""
    values = b"".join([_scalar_prefix(tag) + _float32(v) for tag, v in scalars])
    return event(wall_time, step, summary=values)


# --------------------------------------------------------------------------- hparams plugin

EXPERIMENT_TAG = "_hparams_/experiment"
SESSION_START_INFO_TAG = "_hparams_/session_start_info"
SESSION_END_INFO_TAG = "_hparams_/session_end_info"
_PLUGIN_NAME = "hparams"
# HParamsPluginData: version = 1 (0, which TensorBoard requires, so left out),
# oneof data { experiment = 2; session_start_info = 3; session_end_info = 4 }.
_HP_EXPERIMENT = 0x12
_HP_SESSION_START = 0x1A
_HP_SESSION_END = 0x22
# api.proto DataType and Status values.
_DATA_TYPE_UNSET, _DATA_TYPE_STRING, _DATA_TYPE_BOOL, _DATA_TYPE_FLOAT64 = 0, 1, 2, 3
_STATUS_SUCCESS = 1


def _plugin_summary(tag: str, content: bytes) -> bytes:
    """A ``Summary`` of one value carrying hparams plugin data under ``tag``."""
    plugin_data = _str_field(_MD_PLUGIN_DATA, _PLUGIN_NAME) + _len_field(_PD_CONTENT, content)
    metadata = _len_field(_MD_PLUGIN_DATA, plugin_data)
    return _len_field(_SUM_VALUE, _str_field(_VAL_TAG, tag) + _len_field(_VAL_METADATA, metadata))


def _hparam_value(value: object) -> tuple[bytes, int]:
    """A serialized ``google.protobuf.Value`` for ``value`` and its ``DataType``.

    As ``tensorboardX.summary.hparams``: strings, bools and real numbers keep their
    type (numbers as doubles), callables are named; anything else is an UNSET
    hparam with no value (empty bytes).
    """
    if isinstance(value, str):  # Value.string_value = 3
        return _len_field(0x1A, value.encode("utf-8")), _DATA_TYPE_STRING
    if isinstance(value, bool):  # Value.bool_value = 4
        return bytes((0x20, int(value))), _DATA_TYPE_BOOL
    if isinstance(value, (int, float)):  # Value.number_value = 2, double
        return b"\x11" + _pack_double(float(value)), _DATA_TYPE_FLOAT64
    if callable(value):
        return _hparam_value(str(getattr(value, "__name__", str(value))))[0], _DATA_TYPE_STRING
    return b"", _DATA_TYPE_UNSET


def hparams_summaries(hparam_dict: Mapping[str, object],
                      metric_names: Iterable[str]) -> tuple[bytes, bytes, bytes]:
    """The experiment, session-start and session-end ``Summary`` messages, serialized.

    The same three that ``tensorboardX.summary.hparams(hparam_dict, metric_dict)``
    returns for ``metric_dict``'s keys, in the same order; ``None`` values are skipped.
    """
    infos = []
    entries = []
    for name, value in hparam_dict.items():
        if value is None:
            continue
        encoded, data_type = _hparam_value(value)
        # HParamInfo: name = 1, type = 4.
        infos.append(_len_field(0x22, _str_field(0x0A, name)
                                + (bytes((0x20, data_type)) if data_type else b"")))
        if encoded:
            # SessionStartInfo.hparams = 1, map<string, Value>: entry key = 1, value = 2;
            # protobuf writes a map entry's key even when it is empty.
            entries.append(_len_field(0x0A, _len_field(0x0A, name.encode("utf-8"))
                                      + _len_field(0x12, encoded)))
    # Experiment.metric_infos = 5 -> MetricInfo.name = 1 -> MetricName.tag = 2.
    metrics = [_len_field(0x2A, _len_field(0x0A, _str_field(0x12, tag))) for tag in metric_names]
    experiment = b"".join(infos) + b"".join(metrics)
    session_start = b"".join(entries)
    session_end = bytes((0x08, _STATUS_SUCCESS))  # SessionEndInfo.status = 1
    return (
        _plugin_summary(EXPERIMENT_TAG, _len_field(_HP_EXPERIMENT, experiment)),
        _plugin_summary(SESSION_START_INFO_TAG, _len_field(_HP_SESSION_START, session_start)),
        _plugin_summary(SESSION_END_INFO_TAG, _len_field(_HP_SESSION_END, session_end)),
    )

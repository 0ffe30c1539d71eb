"""Fuzzed segment tails: truncation, bit flips and zeros never yield a damaged record, and
recovery tells a torn tail (cut and kept aside) from corruption (quarantined and reported)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import outbox
from outbox import OutboxReader, ShardWriter
from outbox.frame import HEADER_SIZE, Kind, encode
from outbox.segment import State, list_segments, parse, scan_file, segment_name

SHARD, SEGNO = 7, 3
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DISK = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass(frozen=True)
class Built:
    """A segment's bytes and the frames it was made of."""

    data: bytes
    frames: list[tuple[Kind, int, bytes]]  # (kind, seq, payload)
    bounds: list[tuple[int, int]]  # (start, end) of each frame

    def frame_at(self, offset: int) -> int:
        """Index of the frame holding byte ``offset``."""
        return next(i for i, (start, end) in enumerate(self.bounds) if start <= offset < end)


def build(payloads: list[bytes], *, sealed: bool = False) -> Built:
    """A segment of SHARD/SEGNO: a header, one DATA frame per payload, and a seal if asked."""
    frames = [(Kind.HEADER, 0, b"")] + [(Kind.DATA, i + 1, p) for i, p in enumerate(payloads)]
    if sealed:
        frames.append((Kind.SEAL, len(frames), b""))
    chunks, bounds, pos = [], [], 0
    for kind, seq, payload in frames:
        chunk = encode(SHARD, SEGNO, kind, seq, 1_700_000_000_000 + seq, payload)
        chunks.append(chunk)
        bounds.append((pos, pos + len(chunk)))
        pos += len(chunk)
    return Built(b"".join(chunks), frames, bounds)


def assert_only_originals(built: Built, buf: bytes) -> State:
    """Parse ``buf``: every yielded frame must be the original frame at its index."""
    scan = parse(buf, SHARD, SEGNO)
    got = [(f.kind, f.seq, f.payload) for f in scan.frames]
    assert got == built.frames[: len(got)]
    assert [(f.offset, f.end) for f in scan.frames] == built.bounds[: len(got)]
    return scan.state


payload_lists = st.lists(st.binary(min_size=0, max_size=80), min_size=1, max_size=12)


@FUZZ
@given(payloads=payload_lists, sealed=st.booleans(), last=st.integers(1, 3))
def test_truncation_at_every_offset_of_the_last_records_is_a_torn_tail(payloads, sealed, last):
    """Cutting a segment anywhere in its last records keeps exactly the whole frames before the cut."""
    built = build(payloads, sealed=sealed)
    first = built.bounds[max(0, len(built.bounds) - last)][0]
    ends = {end for _, end in built.bounds}
    for cut in range(first, len(built.data)):
        scan = parse(built.data[:cut], SHARD, SEGNO)
        assert_only_originals(built, built.data[:cut])
        whole = [end for _, end in built.bounds if end <= cut]
        assert scan.valid_end == (whole[-1] if whole else 0)
        assert scan.state is (State.CLEAN if cut in ends or cut == 0 else State.TORN), cut
        assert not scan.sealed


@FUZZ
@given(payloads=payload_lists, sealed=st.booleans(), data=st.data())
def test_bit_flips_are_torn_only_when_no_valid_frame_follows(payloads, sealed, data):
    """Damage followed by an intact frame is CORRUPT; damage in the last intact frames is TORN."""
    built = build(payloads, sealed=sealed)
    flips = data.draw(st.lists(st.tuples(st.integers(0, len(built.data) - 1), st.integers(0, 7)),
                               min_size=1, max_size=4))
    buf = bytearray(built.data)
    for offset, bit in flips:
        buf[offset] ^= 1 << bit
    if bytes(buf) == built.data:  # flips cancelled out
        return
    damaged = {built.frame_at(offset) for offset, _ in flips
               if buf[offset] != built.data[offset]}
    first = min(damaged)
    intact_after = any(i not in damaged for i in range(first + 1, len(built.frames)))
    state = assert_only_originals(built, bytes(buf))
    assert state is (State.CORRUPT if intact_after else State.TORN)
    assert parse(bytes(buf), SHARD, SEGNO).bad_offset == built.bounds[first][0]


@FUZZ
@given(payloads=payload_lists, sealed=st.booleans(), zeros=st.integers(1, 300),
       cut_back=st.one_of(st.just(0), st.integers(1, 40)))
def test_zeros_after_the_data_are_torn_unless_after_a_seal(payloads, sealed, zeros, cut_back):
    """Zeros where a write never landed (optionally after a partial frame) are a torn tail;
    anything after a seal is corruption."""
    built = build(payloads, sealed=sealed)
    cut = max(HEADER_SIZE, len(built.data) - cut_back)
    buf = built.data[:cut] + bytes(zeros)
    state = assert_only_originals(built, buf)
    after_seal = sealed and cut == len(built.data)
    assert state is (State.CORRUPT if after_seal else State.TORN)


def test_a_frame_copied_from_another_segment_never_validates():
    """The CRC covers the segment identity: the same bytes under another name parse as nothing."""
    data = build([b"a", b"b"]).data
    assert parse(data, SHARD, SEGNO + 1).frames == []
    assert parse(data, SHARD + 1, SEGNO).frames == []


def test_a_segment_must_start_with_its_header_and_count_without_gaps():
    """A DATA frame in the header's place, or a skipped sequence number, is corruption."""
    no_header = encode(SHARD, SEGNO, Kind.DATA, 0, 0, b"x") + encode(SHARD, SEGNO, Kind.DATA, 1, 0, b"y")
    scan = parse(no_header, SHARD, SEGNO)
    assert (scan.state, scan.bad_offset, scan.reason) == (State.CORRUPT, 0, "DATA frame at sequence 0")
    built = build([b"a", b"b", b"c"])
    start, end = built.bounds[2]
    gap = parse(built.data[:start] + built.data[end:], SHARD, SEGNO)
    assert (gap.state, gap.bad_offset, len(gap.frames)) == (State.CORRUPT, start, 2)
    assert gap.reason == "sequence 3 where 2 expected"


def install(directory: str, buf: bytes) -> str:
    """Put ``buf`` in place as SHARD's segment SEGNO, as a dead writer would have left it."""
    path = os.path.join(directory, segment_name(SHARD, SEGNO))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(buf)
    return path


def read_values(directory: str) -> list[bytes]:
    with OutboxReader.open(directory) as reader:
        out = []
        while chunk := reader.poll(100):
            out.extend(r.payload for r in chunk)
        return out


@DISK
@given(payloads=payload_lists, data=st.data())
def test_recovery_cuts_a_torn_tail_aside_and_keeps_the_records_before_it(payloads, data):
    """A torn tail is copied into torn/, cut off, and the segment sealed; earlier records read once."""
    built = build(payloads)
    cut = data.draw(st.integers(built.bounds[0][1], len(built.data) - 1))
    garbage = data.draw(st.sampled_from([b"", b"\x00" * 37, b"\xff\x13junk"]))
    buf = built.data[:cut] + garbage
    # Whole frames: those the cut kept, and one the garbage happens to complete byte for byte
    # (a cut just before a payload's last zero byte, followed by zeros).
    whole = [i for i, (_, end) in enumerate(built.bounds) if buf[:end] == built.data[:end]]
    valid_end = built.bounds[whole[-1]][1]
    with tempfile.TemporaryDirectory() as d:
        path = install(d, buf)
        with ShardWriter.open(d, SHARD) as w:
            assert w.segno == SEGNO + 1
        scan = scan_file(d, SHARD, SEGNO)
        assert scan.sealed and scan.state is State.CLEAN
        assert os.path.getsize(path) == valid_end + HEADER_SIZE  # kept frames, then the seal
        torn = os.path.join(d, "torn")
        tails = os.listdir(torn) if os.path.isdir(torn) else []
        if len(buf) > valid_end:
            assert len(tails) == 1
            with open(os.path.join(d, "torn", tails[0]), "rb") as f:
                assert f.read() == buf[valid_end:]
        else:
            assert tails == []
        assert read_values(d) == [p for kind, _, p in built.frames[: len(whole)] if kind is Kind.DATA]
        assert outbox.verify(d).corrupt == []


@DISK
@given(payloads=st.lists(st.binary(max_size=60), min_size=2, max_size=10), data=st.data())
def test_recovery_quarantines_a_segment_with_damage_before_valid_frames(payloads, data):
    """A flipped byte before intact frames moves the segment to quarantine/, reported by verify and status."""
    built = build(payloads)
    victim = data.draw(st.integers(0, len(built.frames) - 2))
    start, end = built.bounds[victim]
    offset = data.draw(st.integers(start, end - 1))
    buf = bytearray(built.data)
    buf[offset] ^= 0x01
    with tempfile.TemporaryDirectory() as d:
        install(d, bytes(buf))
        with ShardWriter.open(d, SHARD) as w:
            assert w.segno == SEGNO + 1
            w.append("after")
            w.commit()
        assert SEGNO not in list_segments(d)[SHARD]
        assert os.listdir(os.path.join(d, "quarantine")) == [segment_name(SHARD, SEGNO)]
        moved = os.path.join("quarantine", segment_name(SHARD, SEGNO))
        assert [s.path for s in outbox.verify(d).corrupt] == [moved]
        assert outbox.status(d).quarantined == [segment_name(SHARD, SEGNO)]
        assert read_values(d) == [b'"after"']

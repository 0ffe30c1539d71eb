"""What the healthy-disk outbox tests share: a small writer config, writing records and
reading them back (or flushing them), a writer process that dies, and damaging a segment."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import outbox
from outbox import OutboxReader, ShardWriter, WriterConfig
from outbox.segment import segment_name

SMALL = WriterConfig(segment_bytes=4096, reserve_bytes=0)


def read_all(directory: str, *, flush: bool = False) -> list[outbox.Record]:
    """Every record a fresh reader yields; with ``flush``, mark them flushed and checkpoint."""
    with OutboxReader.open(directory) as reader:
        records = drain(reader)
        if flush:
            reader.mark_flushed(records)
            reader.checkpoint()
    return records


def drain(reader: OutboxReader, batch: int = 7) -> list[outbox.Record]:
    """Poll until a poll returns nothing."""
    out: list[outbox.Record] = []
    while chunk := reader.poll(batch):
        out.extend(chunk)
    return out


def values(records: list[outbox.Record], shard: int | None = None) -> list[object]:
    return [r.value() for r in records if shard is None or r.shard == shard]


def write(directory: str, shard: int, items: list[object], config: WriterConfig = SMALL) -> None:
    with ShardWriter.open(directory, shard, config) as w:
        for item in items:
            w.append(item)
            w.commit()


def run_child(code: str) -> None:
    """Run ``code`` in a fresh interpreter (a separate process), failing on a non-zero exit."""
    subprocess.run([sys.executable, "-c", textwrap.dedent(code)], check=True, cwd=os.getcwd(),
                   env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(outbox.__file__))})


def die_after_writing(directory: str, shard: int, items: list[object]) -> None:
    """Commit ``items`` from another process that then exits without closing (no seal)."""
    run_child(f"""
        import os
        from outbox import ShardWriter
        w = ShardWriter.open({directory!r}, {shard})
        for item in {items!r}:
            w.append(item)
            w.commit()
        w.append("never committed")
        os._exit(0)
    """)


def append_junk(directory: str, shard: int, segno: int, junk: bytes = b"\x01" * 10) -> None:
    with open(os.path.join(directory, segment_name(shard, segno)), "ab") as f:
        f.write(junk)


def flip_byte(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x40]))


def flush_passes(directory: str, passes: int = 3) -> list[outbox.Record]:
    """What a flusher does over a few passes: poll, mark flushed, checkpoint."""
    out: list[outbox.Record] = []
    with OutboxReader.open(directory) as reader:
        for _ in range(passes):
            records = drain(reader)
            reader.mark_flushed(records)
            reader.checkpoint()
            out.extend(records)
    return out

#!/usr/bin/env python3
"""Decode a Perfetto trace file with the official schema and print a JSON summary.

Usage: trace_summary.py TRACE_FILE

The whole file is parsed as `perfetto.protos.Trace` with the descriptor from
the PyPI `perfetto` package, i.e. exactly the schema trace_processor and the
UI use. Any parse error exits non-zero. The summary is one JSON object:

  packet_count            number of TracePackets
  packets                 per packet, in file order: index, kind (name of the
                          set `data` oneof field or null), timestamp,
                          trusted_packet_sequence_id, sequence_flags,
                          first_packet_on_sequence, and uuid for
                          track_descriptor / track_uuid for track_event
  sequence_ids            sorted distinct trusted_packet_sequence_id values
  clock_snapshots         [{timestamp, primary_trace_clock, clocks: [{clock_id, timestamp}]}]
  system_info             first SystemInfo as a dict (utsname, hz, page_size,
                          num_cpus, ...) or null
  process_tree            {processes: [{pid, ppid, cmdline, ...}], threads: [{tid, tgid, name}]}
                          merged over all ProcessTree packets
  track_descriptors       [{uuid, parent_uuid, name, description,
                          process: {pid, process_name, ...} | null,
                          counter: {unit, unit_name, ...} | null}]
  counters                {"<track_uuid>": [[ts, value], ...]} from TYPE_COUNTER
                          TrackEvents (counter_value or double_counter_value)
  sys_stats               [{ts, cpu_stat: [...], psi: [{resource, total_ns}], ...}]
  process_stats           [{ts, processes: [{pid, vm_rss_kb, ...}]}]
  ftrace_event_bundles, perf_samples, profile_packets: counts

Enums are printed by value name (e.g. "UNIT_SIZE_BYTES"), absent optional
fields are omitted from the per-message dicts, and 64-bit integers stay JSON
integers (not strings as in protobuf's JSON mapping).
"""
import json
import sys

from google.protobuf import descriptor as _descriptor
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

_ENUM = _descriptor.FieldDescriptor.TYPE_ENUM
_MESSAGE = _descriptor.FieldDescriptor.TYPE_MESSAGE


def to_dict(msg):
    """Set fields of `msg` as plain JSON values; enums by name."""
    out = {}
    for field, value in msg.ListFields():
        def conv(v):
            if field.type == _MESSAGE:
                return to_dict(v)
            if field.type == _ENUM:
                ev = field.enum_type.values_by_number.get(v)
                return ev.name if ev is not None else v
            if isinstance(v, bytes):
                return v.hex()
            return v
        out[field.name] = [conv(v) for v in value] if field.is_repeated else conv(value)
    return out


def opt(msg, name):
    return getattr(msg, name) if msg.HasField(name) else None


def summarize(trace):
    s = {
        "packet_count": len(trace.packet),
        "packets": [],
        "sequence_ids": [],
        "clock_snapshots": [],
        "system_info": None,
        "process_tree": {"processes": [], "threads": []},
        "track_descriptors": [],
        "counters": {},
        "sys_stats": [],
        "process_stats": [],
        "ftrace_event_bundles": 0,
        "perf_samples": 0,
        "profile_packets": 0,
    }
    seqs = set()
    for i, p in enumerate(trace.packet):
        kind = p.WhichOneof("data")
        ts = opt(p, "timestamp")
        seq = opt(p, "trusted_packet_sequence_id")
        if seq is not None:
            seqs.add(seq)
        info = {
            "index": i,
            "kind": kind,
            "timestamp": ts,
            "trusted_packet_sequence_id": seq,
            "sequence_flags": opt(p, "sequence_flags"),
            "first_packet_on_sequence": opt(p, "first_packet_on_sequence"),
        }
        if kind == "clock_snapshot":
            cs = p.clock_snapshot
            s["clock_snapshots"].append({
                "timestamp": ts,
                "primary_trace_clock": opt(cs, "primary_trace_clock"),
                "clocks": [{"clock_id": c.clock_id, "timestamp": c.timestamp} for c in cs.clocks],
            })
        elif kind == "system_info":
            if s["system_info"] is None:
                s["system_info"] = to_dict(p.system_info)
        elif kind == "process_tree":
            s["process_tree"]["processes"] += [to_dict(x) for x in p.process_tree.processes]
            s["process_tree"]["threads"] += [to_dict(x) for x in p.process_tree.threads]
        elif kind == "track_descriptor":
            td = p.track_descriptor
            info["uuid"] = td.uuid
            s["track_descriptors"].append({
                "uuid": td.uuid,
                "parent_uuid": opt(td, "parent_uuid"),
                "name": opt(td, "name"),
                "description": opt(td, "description"),
                "process": to_dict(td.process) if td.HasField("process") else None,
                "thread": to_dict(td.thread) if td.HasField("thread") else None,
                "counter": to_dict(td.counter) if td.HasField("counter") else None,
            })
        elif kind == "track_event":
            te = p.track_event
            info["track_uuid"] = opt(te, "track_uuid")
            if te.type == pb.TrackEvent.TYPE_COUNTER:
                which = te.WhichOneof("counter_value_field")
                value = getattr(te, which) if which else None
                s["counters"].setdefault(str(te.track_uuid), []).append([ts, value])
        elif kind == "sys_stats":
            d = to_dict(p.sys_stats)
            d["ts"] = ts
            s["sys_stats"].append(d)
        elif kind == "process_stats":
            s["process_stats"].append({
                "ts": ts,
                "processes": [to_dict(x) for x in p.process_stats.processes],
            })
        elif kind == "ftrace_events":
            s["ftrace_event_bundles"] += 1
        elif kind == "perf_sample":
            s["perf_samples"] += 1
        elif kind == "profile_packet":
            s["profile_packets"] += 1
        s["packets"].append(info)
    s["sequence_ids"] = sorted(seqs)
    return s


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    with open(argv[1], "rb") as f:
        data = f.read()
    trace = pb.Trace()
    try:
        trace.ParseFromString(data)
    except Exception as e:  # DecodeError, or RuntimeError from some backends
        print(f"{argv[1]}: not a valid Perfetto trace ({len(data)} bytes): {e}", file=sys.stderr)
        return 1
    json.dump(summarize(trace), sys.stdout, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

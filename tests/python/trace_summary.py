#!/usr/bin/env python3
"""Decode a Perfetto trace file with the official schema and print a JSON summary.

Usage: trace_summary.py [--capture] TRACE_FILE

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

With --capture, also:
  compact_sched           per FtraceEventBundle in file order: {cpu, lost_events,
                          switches: [{ts, prev_state, next_pid, next_prio, next_comm}],
                          wakings: [{ts, pid, target_cpu, prio, comm}]}; ts are
                          absolute, decoded from the per-bundle deltas as
                          trace_processor does
  samples                 per PerfSample: {ts, seq, cpu, pid, tid, callstack_iid,
                          frames: [function name or null, outermost first],
                          mappings: [mapping path per frame], build_ids: [hex]}
                          resolved through the sequence's InternedData

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


def decode_compact(bundle):
    cs = bundle.compact_sched
    table = list(cs.intern_table)
    out = {"cpu": bundle.cpu, "lost_events": bundle.lost_events, "switches": [], "wakings": []}
    ts = 0
    for i in range(len(cs.switch_timestamp)):
        ts += cs.switch_timestamp[i]
        out["switches"].append({
            "ts": ts,
            "prev_state": cs.switch_prev_state[i],
            "next_pid": cs.switch_next_pid[i],
            "next_prio": cs.switch_next_prio[i],
            "next_comm": table[cs.switch_next_comm_index[i]],
        })
    ts = 0
    for i in range(len(cs.waking_timestamp)):
        ts += cs.waking_timestamp[i]
        out["wakings"].append({
            "ts": ts,
            "pid": cs.waking_pid[i],
            "target_cpu": cs.waking_target_cpu[i],
            "prio": cs.waking_prio[i],
            "comm": table[cs.waking_comm_index[i]],
        })
    return out


def capture_details(trace):
    bundles = []
    samples = []
    interned = {}  # seq -> {kind: {iid: msg}}
    for p in trace.packet:
        seq = p.trusted_packet_sequence_id
        if p.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
            interned[seq] = {}
        if p.HasField("interned_data"):
            st = interned.setdefault(seq, {})
            idata = p.interned_data
            for kind in ("function_names", "mapping_paths", "build_ids", "mappings", "frames", "callstacks"):
                for m in getattr(idata, kind):
                    st.setdefault(kind, {})[m.iid] = m
        kind = p.WhichOneof("data")
        if kind == "ftrace_events":
            bundles.append(decode_compact(p.ftrace_events))
        elif kind == "perf_sample":
            ps = p.perf_sample
            st = interned.get(seq, {})
            frames, maps, bids = [], [], []
            if ps.HasField("callstack_iid"):
                cs = st.get("callstacks", {}).get(ps.callstack_iid)
                for fid in (cs.frame_ids if cs else []):
                    fr = st.get("frames", {}).get(fid)
                    name = None
                    if fr is not None and fr.HasField("function_name_id"):
                        s_ = st.get("function_names", {}).get(fr.function_name_id)
                        name = s_.str.decode("utf-8", "replace") if s_ else None
                    frames.append(name)
                    mp = st.get("mappings", {}).get(fr.mapping_id) if fr else None
                    path = None
                    if mp is not None:
                        parts = [st.get("mapping_paths", {}).get(i) for i in mp.path_string_ids]
                        path = "/" + "/".join(x.str.decode("utf-8", "replace") for x in parts if x)
                        if mp.HasField("build_id"):
                            b = st.get("build_ids", {}).get(mp.build_id)
                            if b is not None:
                                bids.append(b.str.hex())
                    maps.append(path)
            samples.append({
                "ts": p.timestamp, "seq": seq, "cpu": ps.cpu, "pid": ps.pid, "tid": ps.tid,
                "callstack_iid": opt(ps, "callstack_iid"), "frames": frames,
                "mappings": maps, "build_ids": sorted(set(bids)),
            })
    return {"compact_sched": bundles, "samples": samples}


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
    capture = "--capture" in argv
    argv = [a for a in argv if a != "--capture"]
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
    s = summarize(trace)
    if capture:
        s.update(capture_details(trace))
    json.dump(s, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env python3
"""Decode a binary TraceConfig with the official Perfetto schema.

Usage: decode_config.py FILE

Prints the TraceConfig as JSON (field names as in the .proto, enums by name,
unset fields omitted), so tests can compare exactly what traced would read.
Exits 1 if the file does not parse.
"""
import json
import sys

from google.protobuf import json_format
from perfetto.protos.perfetto.trace import perfetto_trace_pb2


def main():
    data = open(sys.argv[1], "rb").read()
    cfg = perfetto_trace_pb2.TraceConfig()
    cfg.ParseFromString(data)
    d = json_format.MessageToDict(cfg, preserving_proto_field_name=True)
    print(json.dumps(d, sort_keys=True))


if __name__ == "__main__":
    main()

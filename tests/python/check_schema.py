#!/usr/bin/env python3
"""Compare vitalsd's .proto files with the official Perfetto schema.

Usage: check_schema.py [PROTO_DIR]   (default: <workspace>/proto/protos)

Every message and enum we declare must exist in the official descriptor
(PyPI `perfetto`, perfetto.protos.perfetto.trace.perfetto_trace_pb2) under the
same full name, and every field must match the official one in name, number,
label and type; every enum value must match in name and number. Omitting
fields is fine (parsers skip unknown fields), but a wrong number or type
silently corrupts traces, so any mismatch exits 1.

Our .proto files are parsed with a small tokenizer that understands exactly
the subset of proto2 we write: package, import, message, enum, oneof,
optional/repeated fields, field options in [...], and // or /* */ comments.
"""
import os
import re
import sys

from perfetto.protos.perfetto.trace import perfetto_trace_pb2

SCALARS = {
    1: "double", 2: "float", 3: "int64", 4: "uint64", 5: "int32", 6: "fixed64",
    7: "fixed32", 8: "bool", 9: "string", 12: "bytes", 13: "uint32",
    15: "sfixed32", 16: "sfixed64", 17: "sint32", 18: "sint64",
}
TOKEN = re.compile(r'\s+|//[^\n]*|/\*.*?\*/|"[^"]*"|[A-Za-z_][\w.]*|-?\d+|[{}\[\];=,<>()]', re.S)


def tokenize(text):
    pos, out = 0, []
    while pos < len(text):
        m = TOKEN.match(text, pos)
        if not m:
            raise SyntaxError(f"unexpected character {text[pos]!r} at offset {pos}")
        tok = m.group(0)
        pos = m.end()
        if not (tok.isspace() or tok.startswith("//") or tok.startswith("/*")):
            out.append(tok)
    return out


def parse(path):
    """Returns (package, messages, enums): messages maps full name to a list of
    (label, type, name, number); enums maps full name to {value name: number}."""
    toks = tokenize(open(path, encoding="utf-8").read())
    package = ""
    messages, enums = {}, {}
    stack = []  # (kind, full name)
    i = 0

    def skip_to(tok):
        nonlocal i
        while toks[i] != tok:
            i += 1
        i += 1

    while i < len(toks):
        t = toks[i]
        scope = stack[-1] if stack else None
        if t in ("syntax", "import", "option"):
            skip_to(";")
        elif t == "package":
            package = toks[i + 1]
            skip_to(";")
        elif t in ("message", "enum"):
            parent = next((n for k, n in reversed(stack) if k != "oneof"), package)
            full = f"{parent}.{toks[i + 1]}"
            (messages if t == "message" else enums)[full] = [] if t == "message" else {}
            stack.append((t, full))
            assert toks[i + 2] == "{", f"{path}: expected '{{' after {t} {full}"
            i += 3
        elif t == "oneof":
            stack.append(("oneof", stack[-1][1]))
            i += 3
        elif t == "}":
            stack.pop()
            i += 1
        elif t == "reserved":
            skip_to(";")
        elif scope and scope[0] == "enum":
            enums[scope[1]][t] = int(toks[i + 2])
            skip_to(";")
        elif scope and scope[0] in ("message", "oneof"):
            if t in ("optional", "repeated", "required"):
                label, i = t, i + 1
            else:
                assert scope[0] == "oneof", f"{path}: field without label: {toks[i:i + 4]}"
                label = "optional"
            ftype, name, eq, num = toks[i:i + 4]
            assert eq == "=", f"{path}: malformed field near {toks[i:i + 4]}"
            messages[scope[1]].append((label, ftype, name, int(num)))
            skip_to(";")
        else:
            raise SyntaxError(f"{path}: unexpected token {t!r}")
    return package, messages, enums


def resolve(type_name, scope, known):
    """Resolves a type reference the way protoc does: innermost scope first."""
    if type_name in SCALARS.values():
        return type_name
    if type_name.startswith("."):
        return type_name[1:]
    parts = scope.split(".")
    while parts:
        cand = ".".join(parts + [type_name])
        if cand in known:
            return cand
        parts.pop()
    return type_name


def official_type(f):
    if f.message_type is not None:
        return f.message_type.full_name
    if f.enum_type is not None:
        return f.enum_type.full_name
    return SCALARS[f.type]


def official_label(f):
    if f.is_repeated:
        return "repeated"
    return "required" if getattr(f, "is_required", False) else "optional"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    proto_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "..", "proto", "protos")
    files = sorted(f for f in os.listdir(proto_dir) if f.endswith(".proto"))
    if not files:
        print(f"no .proto files in {proto_dir}", file=sys.stderr)
        return 2

    messages, enums = {}, {}
    for f in files:
        _, m, e = parse(os.path.join(proto_dir, f))
        messages.update(m)
        enums.update(e)
    known = set(messages) | set(enums)

    pool = perfetto_trace_pb2.DESCRIPTOR.pool
    errors = []
    nfields = nvalues = 0
    for full, fields in sorted(messages.items()):
        try:
            desc = pool.FindMessageTypeByName(full)
        except KeyError:
            errors.append(f"message {full}: not in the official schema")
            continue
        seen_nums = set()
        for label, ftype, name, num in fields:
            nfields += 1
            where = f"{full}.{name} = {num}"
            if num in seen_nums:
                errors.append(f"{where}: duplicate field number")
            seen_nums.add(num)
            off = desc.fields_by_name.get(name)
            if off is None:
                by_num = desc.fields_by_number.get(num)
                hint = f" (official field {num} is {by_num.name})" if by_num else ""
                errors.append(f"{where}: no such field in official {full}{hint}")
                continue
            if off.number != num:
                errors.append(f"{where}: official number is {off.number}")
            if official_label(off) != label:
                errors.append(f"{where}: label {label}, official {official_label(off)}")
            ours = resolve(ftype, full, known)
            theirs = official_type(off)
            if ours != theirs:
                errors.append(f"{where}: type {ours}, official {theirs}")
    for full, values in sorted(enums.items()):
        try:
            desc = pool.FindEnumTypeByName(full)
        except KeyError:
            errors.append(f"enum {full}: not in the official schema")
            continue
        for name, num in values.items():
            nvalues += 1
            off = desc.values_by_name.get(name)
            if off is None:
                errors.append(f"enum {full}: no value {name}")
            elif off.number != num:
                errors.append(f"enum {full}.{name} = {num}: official number is {off.number}")

    for e in errors:
        print(e, file=sys.stderr)
    print(f"checked {len(messages)} messages ({nfields} fields), {len(enums)} enums "
          f"({nvalues} values) in {len(files)} files: {len(errors)} mismatches")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

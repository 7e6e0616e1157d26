"""Validates shardscope-check's reports with real validators: SARIF against the OASIS SARIF
2.1.0 JSON schema (jsonschema), JUnit XML against Jenkins' JUnit XSD (xmlschema), both
vendored in tests/check/schemas (SOURCES.md). Both packages are pinned in
python/requirements.txt.

    python validate_reports.py [--sarif FILE]... [--junit FILE]...

Exit 0 when every file is valid; 1, naming the file and the first error, otherwise.
"""
import argparse
import json
import os
import sys

import jsonschema
import xmlschema

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "schemas")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sarif", action="append", default=[])
    p.add_argument("--junit", action="append", default=[])
    a = p.parse_args()
    schema = json.load(open(os.path.join(HERE, "sarif-schema-2.1.0.json")))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    xsd = xmlschema.XMLSchema(os.path.join(HERE, "junit-10.xsd"))
    bad = 0
    for f in a.sarif:
        errors = sorted(validator.iter_errors(json.load(open(f))), key=lambda e: e.path)
        for e in errors[:3]:
            print(f"{f}: SARIF 2.1.0: {'/'.join(map(str, e.absolute_path))}: {e.message}")
        bad += bool(errors)
    for f in a.junit:
        try:
            xsd.validate(f)
        except xmlschema.XMLSchemaValidationError as e:
            print(f"{f}: JUnit XSD: {e.reason} at {e.path}")
            bad += 1
    print(f"{len(a.sarif) + len(a.junit) - bad} valid, {bad} invalid")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

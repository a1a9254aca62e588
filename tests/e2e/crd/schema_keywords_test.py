#!/usr/bin/env python3
"""Every key of every schema node in the TrainingJob CRD is an OpenAPI keyword.

An unquoted flow-style description with a comma ({description: a, b}) silently ends at the comma and turns the rest
into a stray key: kubectl apply without validation keeps the truncated text, validating clients refuse the CRD.
This catches it without a cluster. Usage: schema_keywords_test.py CRD.yaml
"""
import sys

import yaml

KEYWORDS = {
    "type", "description", "properties", "items", "default", "enum", "minimum", "maximum", "format", "required",
    "additionalProperties", "nullable", "minItems", "maxItems", "pattern", "minLength", "maxLength", "anyOf", "oneOf",
    "allOf", "not", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "uniqueItems", "minProperties",
    "maxProperties", "example", "x-kubernetes-preserve-unknown-fields", "x-kubernetes-int-or-string",
    "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-map-type", "x-kubernetes-embedded-resource",
    "x-kubernetes-validations",
}


def walk(schema, path, bad):
    if not isinstance(schema, dict):
        bad.append(f"{path}: not a mapping")
        return
    for key in schema:
        if key not in KEYWORDS:
            bad.append(f"{path or '.'}: unknown key {key!r}")
    for name, sub in (schema.get("properties") or {}).items():
        walk(sub, f"{path}.{name}", bad)
    if isinstance(schema.get("items"), dict):
        walk(schema["items"], f"{path}[]", bad)
    if isinstance(schema.get("additionalProperties"), dict):
        walk(schema["additionalProperties"], f"{path}{{}}", bad)


def main():
    path = sys.argv[1]
    with open(path) as f:
        crd = yaml.safe_load(f)
    bad = []
    for version in crd["spec"]["versions"]:
        walk(version["schema"]["openAPIV3Schema"], "", bad)
    for b in bad:
        print(f"{path}: {b} (quote descriptions that contain a comma)")
    print(f"{path}: {'FAIL' if bad else 'ok'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

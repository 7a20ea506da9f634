"""One run of the Python client loop (e2e/tests/clients.rs): a DynamicClient with a fresh
discovery cache must find every group/version/resource any apiserver serves.

Usage: dynamic_client.py KUBECONFIG CONTEXT CACHE_FILE EXPECTED_JSON
EXPECTED_JSON is a list of [group, version, resource, kind]. Exit 0 when every one is found;
otherwise each miss is printed on stderr, one line each, and the exit status is 1.
"""

import json
import sys

from kubernetes import config
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ResourceNotFoundError, ResourceNotUniqueError


def main():
    kubeconfig, context, cache_file, expected_path = sys.argv[1:5]
    with open(expected_path) as f:
        expected = json.load(f)
    api_client = config.new_client_from_config(config_file=kubeconfig, context=context)
    client = DynamicClient(api_client, cache_file=cache_file)
    missing = []
    for group, version, resource, kind in expected:
        api_version = f"{group}/{version}" if group else version
        try:
            found = client.resources.get(api_version=api_version, name=resource)
        except (ResourceNotFoundError, ResourceNotUniqueError) as e:
            missing.append(f"{api_version} {resource}: {type(e).__name__}: {e}")
            continue
        if found.kind != kind:
            missing.append(f"{api_version} {resource}: kind {found.kind}, expected {kind}")
    # The lookup the issue started from: by kind, as most scripts do it.
    try:
        client.resources.get(api_version="resource.k8s.io/v1", kind="ResourceClaim")
    except (ResourceNotFoundError, ResourceNotUniqueError) as e:
        missing.append(f"resource.k8s.io/v1 kind=ResourceClaim: {type(e).__name__}: {e}")
    for line in missing:
        print(line, file=sys.stderr)
    print(f"{len(expected) - len(missing)} of {len(expected)} found")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())

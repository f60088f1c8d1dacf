"""Offline checks of deploy/ that need more than a schema; called by deploy/validate.sh.

    python3 deploy/checks.py WORKDIR

WORKDIR/render/*.yaml holds `kubectl kustomize` output, one file per kustomization. This
script writes WORKDIR/native/*.yaml (the Kubernetes objects, for kubernetes-validate),
WORKDIR/rules/<name>/ (floodgate rule directories, for `floodgate check-config`) and
WORKDIR/rules.txt (those directories and where their files come from), and checks:

- every object is a Kubernetes built-in or a known CRD (EnvoyFilter); EnvoyFilters have
  their required fields, and each patch value parses as the Envoy message it patches;
- the floodgate Deployment keeps the contract of SPEC 1.1/1.2/6 (probes, drain, mounts,
  security) and its Service names and protocols its ports;
- envoy.yaml parses as an Envoy v3 Bootstrap, strictly, with the protoc-gen-validate
  rules that matter (required fields, minimum lengths), and its clusters line up;
- the Istio and Envoy examples send exactly the descriptors their rule files limit;
- the AI Gateway token budgets: the BackendTrafficPolicy's global rules use only the fields
  Envoy Gateway declares, each cost read from AI Gateway's metadata names a key the
  AIGatewayRoute's llmRequestCosts writes, a rule charged on the response asks with a
  request cost of 0 (a peek) first and is `shared` (one budget across the route's rules),
  and each per-tenant (Distinct) rule has a shared rule that budgets the requests without
  its header;
- AI Gateway's QuotaPolicy service (deploy/ai-gateway-quota): the Service
  envoy-ai-gateway-ratelimit in envoy-gateway-system serves gRPC on 8081 from floodgate's pods,
  and floodgate takes its rules over xDS (no TLS) from AI Gateway's controller on 18002 with
  node id envoy-ai-gateway-ratelimit, starts without them, and keeps `consume`;
- the Dockerfile has its stages, builds with --locked and runs as non-root;
- the Grafana dashboards parse, and every panel queries Prometheus through the dashboard's
  data source variable; the Prometheus rule files parse and every alert has an expression,
  a severity and a summary (that every metric they name exists is checked against a real
  service by `cargo test --test it metrics::`).

Exits 1 after reporting every failure.
"""

import fnmatch
import json
import pathlib
import re
import shutil
import subprocess
import sys

import yaml
from google.protobuf import descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import FieldDescriptor
from validate import validate_pb2  # protoc-gen-validate's rules, shipped with xds-protos

DEPLOY = pathlib.Path(__file__).resolve().parent
REPO = DEPLOY.parent
CRDS = {("networking.istio.io/v1alpha3", "EnvoyFilter"),
        ("gateway.envoyproxy.io/v1alpha1", "BackendTrafficPolicy"),
        ("aigateway.envoyproxy.io/v1beta1", "AIGatewayRoute")}
# API groups of Kubernetes' own kinds (kubernetes-validate has their schemas).
BUILTIN_GROUPS = {"", "apps", "batch", "policy", "autoscaling", "networking.k8s.io", "rbac.authorization.k8s.io"}
# Descriptor and rate_limit keys floodgate accepts (SPEC 2): a typo fails here even when
# no floodgate binary is at hand; `floodgate check-config` is the full check.
DESCRIPTOR_KEYS = {"key", "value", "rate_limit", "descriptors", "shadow_mode", "quota_mode", "detailed_metric",
                   "value_to_metric", "share_threshold", "metadata"}
RATE_LIMIT_KEYS = {"unit", "requests_per_unit", "unlimited", "name", "replaces", "quota_mode", "algorithm", "burst",
                   "unit_multiplier", "on_over_limit", "lockout_seconds", "scope"}

failures = []


def go_seconds(text):
    """Seconds of a duration in Go's syntax (`10s`, `1m30s`, `500ms`, `0`)."""
    units = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}
    parts = re.findall(r"([0-9.]+)(ns|us|µs|ms|s|m|h)", text)
    if text != "0" and "".join(n + u for n, u in parts) != text:
        raise ValueError(f"`{text}` is not a Go duration")
    return sum(float(n) * units[u] for n, u in parts)


def fail(where, message):
    failures.append(f"{where}: {message}")


def ok(message):
    print(f"ok   {message}")


def load_all(path):
    return [doc for doc in yaml.safe_load_all(pathlib.Path(path).read_text()) if doc]


# ---------------------------------------------------------------- Envoy protos (xds-protos)

def envoy_message(full_name):
    """An empty message of an Envoy type, importing its generated modules on first use;
    None for a type that xds-protos does not have (json_format then reports it)."""
    pool = descriptor_pool.Default()
    try:
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(full_name))()
    except KeyError:
        pass
    package = ".".join(p for p in full_name.split(".") if p[:1].islower())
    try:
        module_dir = pathlib.Path(__import__(package, fromlist=["_"]).__file__).parent
        for module in module_dir.glob("*_pb2.py"):
            __import__(f"{package}.{module.stem}")
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(full_name))()
    except (ImportError, KeyError):
        return None


def import_any_types(value):
    """Imports the module of every `@type` in a JSON-like value, so json_format can pack it."""
    if isinstance(value, dict):
        if "@type" in value:
            envoy_message(value["@type"].split("/", 1)[1])
        for item in value.values():
            import_any_types(item)
    elif isinstance(value, list):
        for item in value:
            import_any_types(item)


def check_pgv(msg, where):
    """The protoc-gen-validate rules (Envoy enforces them at load) that a slip most often
    breaks: required messages and oneofs, non-empty strings and lists."""
    for oneof in msg.DESCRIPTOR.oneofs:
        if oneof.GetOptions().Extensions[validate_pb2.required] and msg.WhichOneof(oneof.name) is None:
            fail(where, f"{msg.DESCRIPTOR.full_name}: one of {oneof.name} is required")
    for field in msg.DESCRIPTOR.fields:
        # A member of a oneof is checked only when it is the one set.
        if field.containing_oneof is not None and msg.WhichOneof(field.containing_oneof.name) != field.name:
            continue
        rules = field.GetOptions().Extensions[validate_pb2.rules]
        value = getattr(msg, field.name)
        # protobuf >= 5.27 has is_repeated; `label` is gone from 7.
        is_repeated = field.is_repeated if hasattr(field, "is_repeated") else field.label == FieldDescriptor.LABEL_REPEATED
        if rules.HasField("message") and rules.message.required and not msg.HasField(field.name):
            fail(where, f"{msg.DESCRIPTOR.full_name}.{field.name} is required")
        if rules.HasField("string") and rules.string.min_len and len(value) < rules.string.min_len:
            fail(where, f"{msg.DESCRIPTOR.full_name}.{field.name} needs {rules.string.min_len}+ characters")
        if rules.HasField("repeated") and rules.repeated.min_items and len(value) < rules.repeated.min_items:
            fail(where, f"{msg.DESCRIPTOR.full_name}.{field.name} needs {rules.repeated.min_items}+ items")
        if field.type != FieldDescriptor.TYPE_MESSAGE:
            continue
        if field.message_type.GetOptions().map_entry:
            children = value.values() if field.message_type.fields_by_name["value"].message_type else []
        elif is_repeated:
            children = value
        else:
            children = [value] if msg.HasField(field.name) else []
        for child in children:
            if child.DESCRIPTOR.full_name == "google.protobuf.Any":
                inner = envoy_message(child.type_url.split("/", 1)[1])
                if inner is not None:
                    inner.ParseFromString(child.value)
                    check_pgv(inner, where)
            else:
                check_pgv(child, where)


def parse_envoy(value, full_name, where, complete=True):
    """Parses a JSON-like value as an Envoy message: unknown fields and bad enums fail.

    `complete=False` is for partial values (an EnvoyFilter MERGE): required fields then live
    in the object being patched, so only names, types and enums are checked."""
    import_any_types(value)
    msg = envoy_message(full_name)
    if msg is None:
        fail(where, f"xds-protos has no message {full_name}")
        return None
    try:
        json_format.ParseDict(value, msg)
    except (json_format.ParseError, KeyError, TypeError) as error:
        fail(where, f"not a valid {full_name}: {error}")
        return None
    if complete:
        check_pgv(msg, where)
    return msg


# ---------------------------------------------------------------- descriptors vs. rules

def action_entry(action, where):
    """The (key, value) entry an Envoy rate-limit action adds; value None = known at run time."""
    (kind, spec), = action.items()
    spec = spec or {}
    if kind == "remote_address":
        return ("remote_address", None)
    if kind == "request_headers":
        return (spec["descriptor_key"], None)
    if kind == "generic_key":
        return (spec.get("descriptor_key", "generic_key"), spec["descriptor_value"])
    if kind == "header_value_match":
        return (spec.get("descriptor_key", "header_match"), spec["descriptor_value"])
    fail(where, f"checks.py does not know the descriptor of action {kind}; teach action_entry()")
    return (kind, None)


def descriptors_of(rate_limits, where):
    return [[action_entry(a, where) for a in rl["actions"]] for rl in rate_limits]


def check_rules_schema(doc, where, path="descriptors"):
    for i, d in enumerate(doc.get("descriptors") or []):
        here = f"{path}[{i}]"
        if "key" not in d:
            fail(where, f"{here} has no key")
        for key in set(d) - DESCRIPTOR_KEYS:
            fail(where, f"{here}: unknown key {key}")
        for key in set(d.get("rate_limit") or {}) - RATE_LIMIT_KEYS:
            fail(where, f"{here}.rate_limit: unknown key {key}")
        check_rules_schema(d, where, f"{here}.descriptors")


def load_rules(path, where):
    doc = yaml.safe_load(pathlib.Path(path).read_text())
    if not isinstance(doc, dict) or not doc.get("domain"):
        fail(where, "a rule file needs a non-empty domain")
        return {"domain": None, "descriptors": []}
    for key in set(doc) - {"domain", "descriptors"}:
        fail(where, f"unknown top-level key {key}")
    check_rules_schema(doc, where)
    return doc


def match(rules, entries):
    """The rule path floodgate matches for a descriptor (exact, wildcard, key-only), or None."""
    level, path = rules.get("descriptors") or [], []
    for key, value in entries:
        same_key = [d for d in level if d["key"] == key]
        exact = [d for d in same_key if value is not None and d.get("value") == value]
        wild = [d for d in same_key if "value" in d and "*" in str(d["value"])
                and (value is None and d["value"] == "*" or value is not None and fnmatch.fnmatchcase(value, d["value"]))]
        default = [d for d in same_key if "value" not in d]
        found = (exact or wild or default or [None])[0]
        if found is None:
            return None
        path.append(found)
        level = found.get("descriptors") or []
    return path if path and "rate_limit" in path[-1] else None


def leaves(level, prefix=()):
    for d in level or []:
        here = prefix + ((d["key"], d.get("value")),)
        if "rate_limit" in d:
            yield here, d
        yield from leaves(d.get("descriptors"), here)


def check_descriptors(where, domain, descriptors, rules_path):
    before = len(failures)
    rules_name = str(rules_path.relative_to(REPO))
    rules = load_rules(rules_path, rules_name)
    if rules["domain"] != domain:
        fail(where, f"domain {domain!r} but {rules_name} declares {rules['domain']!r}")
    used = set()
    for entries in descriptors:
        path = match(rules, entries)
        shown = ", ".join(f"({k}, {v if v is not None else '<runtime>'})" for k, v in entries)
        if path is None:
            fail(where, f"descriptor [{shown}] matches no limit in {rules_name}")
        else:
            used.add(id(path[-1]))
    for leaf, node in leaves(rules.get("descriptors")):
        if id(node) not in used:
            fail(rules_name, f"rule {leaf} is never sent by {where}")
    if len(failures) == before:
        ok(f"{where}: {len(descriptors)} descriptors <-> {rules_name} (domain {domain})")


# ---------------------------------------------------------------- Kubernetes

def split_renders(work):
    """Writes the built-in objects of each render to native/; returns {render: objects}."""
    (work / "native").mkdir(exist_ok=True)
    renders = {}
    for render in sorted((work / "render").glob("*.yaml")):
        objects = load_all(render)
        renders[render.stem] = objects
        native = []
        for obj in objects:
            api, kind = obj.get("apiVersion", ""), obj.get("kind", "")
            group = api.split("/")[0] if "/" in api else ""
            if (api, kind) in CRDS:
                continue
            if group not in BUILTIN_GROUPS:
                fail(render.stem, f"{api} {kind} is neither a Kubernetes kind nor a known CRD")
            native.append(obj)
        (work / "native" / render.name).write_text(yaml.safe_dump_all(native, sort_keys=False))
        ok(f"{render.stem}: {len(objects)} objects rendered")
    return renders


def find(objects, kind, name):
    return next((o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name), None)


def port_number(container, port):
    if isinstance(port, int):
        return port
    return next(p["containerPort"] for p in container["ports"] if p["name"] == port)


# A floodgate setting as the container gives it: the flag (`--flag value` or `--flag=value`),
# else floodgate's variable, else the reference's variable that stands in for it, in the
# precedence docs/migration.md gives. (flag, FLOODGATE_* variable, reference variable or None)
SETTINGS = {
    "config_source": ("--config-source", "FLOODGATE_CONFIG_SOURCE", "CONFIG_TYPE"),
    "xds_server": ("--xds-server", "FLOODGATE_XDS_SERVER", "CONFIG_GRPC_XDS_SERVER_URL"),
    "xds_node_id": ("--xds-node-id", "FLOODGATE_XDS_NODE_ID", "CONFIG_GRPC_XDS_NODE_ID"),
    "xds_tls": ("--xds-tls", "FLOODGATE_XDS_TLS", "CONFIG_GRPC_XDS_SERVER_USE_TLS"),
    "force_start": ("--force-start-without-initial-config", "FLOODGATE_FORCE_START_WITHOUT_INITIAL_CONFIG",
                    "FORCE_START_WITHOUT_INITIAL_CONFIG"),
    "on_over_limit": ("--on-over-limit", "FLOODGATE_ON_OVER_LIMIT", None),
}
BOOL_FLAGS = {"--xds-tls", "--force-start-without-initial-config"}
# clap's BoolishValueParser, which floodgate's boolean flags and variables use.
TRUTHY = {"y", "yes", "t", "true", "on", "1"}


def container_setting(container, name):
    """(value, where it came from) of a floodgate setting in a container, or (None, None).
    Empty values count as unset, as floodgate treats them."""
    flag, own, reference = SETTINGS[name]
    args = [str(a) for a in (container.get("command") or [])[1:] + (container.get("args") or [])]
    for i, arg in enumerate(args):
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1], flag
        if arg == flag:
            if flag in BOOL_FLAGS:
                return "true", flag
            if i + 1 < len(args):
                return args[i + 1], flag
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    for variable in (own, reference):
        if variable and env.get(variable):
            return str(env[variable]), variable
    return None, None


def config_source(container):
    """`file` or `xds`: where the container's floodgate takes its rules from."""
    value, _ = container_setting(container, "config_source")
    return "xds" if (value or "").lower() in ("xds", "grpc_xds_sotw") else "file"


def check_floodgate(render, objects):
    where = f"{render}: Deployment floodgate"
    deployment = find(objects, "Deployment", "floodgate")
    if deployment is None:
        return
    pod = deployment["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "floodgate"]
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    grpc_port = int(env.get("FLOODGATE_GRPC_ADDR", ":8081").rsplit(":", 1)[1])
    http_port = int(env.get("FLOODGATE_HTTP_ADDR", ":8080").rsplit(":", 1)[1])
    if env.get("FLOODGATE_BACKEND") == "memory" and deployment["spec"].get("replicas", 1) != 1:
        fail(where, "the memory backend keeps counts per pod: run exactly one replica")
    if env.get("FLOODGATE_BACKEND") == "memory" and find(objects, "HorizontalPodAutoscaler", "floodgate"):
        fail(where, "the memory backend must not be autoscaled")
    readiness = container.get("readinessProbe", {}).get("grpc", {})
    if readiness.get("port") != grpc_port or readiness.get("service", "") not in (
            "", "envoy.service.ratelimit.v3.RateLimitService"):
        fail(where, f"readiness must be a gRPC probe on {grpc_port}")
    liveness = container.get("livenessProbe", {}).get("httpGet", {})
    if liveness.get("path") != "/livez" or port_number(container, liveness.get("port")) != http_port:
        fail(where, f"liveness must be GET /livez on {http_port}")
    drain_s = go_seconds(env.get("FLOODGATE_DRAIN_TIMEOUT", "10s"))
    sleep_s = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    grace = pod.get("terminationGracePeriodSeconds", 30)
    if grace <= drain_s + sleep_s:
        fail(where, f"terminationGracePeriodSeconds {grace} must exceed preStop {sleep_s}s + drain {drain_s}s")
    security = container.get("securityContext", {})
    wanted = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True}
    for key, value in wanted.items():
        if security.get(key) != value:
            fail(where, f"container securityContext.{key} must be {value}")
    if security.get("capabilities", {}).get("drop") != ["ALL"]:
        fail(where, "container capabilities must drop ALL")
    if pod.get("securityContext", {}).get("seccompProfile", {}).get("type") != "RuntimeDefault":
        fail(where, "pod seccompProfile must be RuntimeDefault")
    if pod.get("automountServiceAccountToken") is not False:
        fail(where, "automountServiceAccountToken must be false")
    annotations = deployment["spec"]["template"]["metadata"].get("annotations", {})
    if annotations.get("prometheus.io/port") != str(http_port) or annotations.get("prometheus.io/path") != "/metrics":
        fail(where, f"Prometheus annotations must point at {http_port}/metrics")
    if config_source(container) == "xds":
        # Rules over xDS: the config directory is neither read nor watched
        # (docs/config.md#rules-over-xds), so there is no rules mount to check.
        ok(f"{where}: probes, drain ({grace}s > {sleep_s}s + {drain_s:g}s), security, rules over xDS")
        return None
    # The rules: a ConfigMap mounted as the config directory, never through subPath.
    mounts = [m for m in container.get("volumeMounts", []) if m["mountPath"] == env.get("FLOODGATE_CONFIG")]
    if len(mounts) != 1 or "subPath" in mounts[0]:
        fail(where, "FLOODGATE_CONFIG must be a whole-directory volume mount (no subPath: hot reload)")
        return None
    volume = next(v for v in pod["volumes"] if v["name"] == mounts[0]["name"])
    config_map = find(objects, "ConfigMap", volume.get("configMap", {}).get("name"))
    if config_map is None:
        fail(where, f"the rules ConfigMap {volume.get('configMap')} is not in the render")
        return None
    ok(f"{where}: probes, drain ({grace}s > {sleep_s}s + {drain_s:g}s), security, rules mount")
    return config_map


def check_service(render, objects):
    service = find(objects, "Service", "floodgate")
    if service is None:
        return
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    if ports.get("grpc", {}).get("port") != 8081 or ports["grpc"].get("appProtocol") != "grpc":
        fail(f"{render}: Service floodgate", "needs port grpc 8081 with appProtocol grpc")
    if ports.get("http-admin", {}).get("port") != 8080 or ports["http-admin"].get("appProtocol") != "http":
        fail(f"{render}: Service floodgate", "needs port http-admin 8080 with appProtocol http")


def check_network_policy(render, objects):
    """The admin port only from monitoring, gRPC only from labelled client namespaces."""
    deployment = find(objects, "Deployment", "floodgate")
    if deployment is None:
        return
    where = f"{render}: NetworkPolicy floodgate"
    policy = find(objects, "NetworkPolicy", "floodgate")
    if policy is None:
        fail(where, "missing: the admin port (/json spends quota) must not be open to the cluster")
        return
    spec = policy["spec"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = spec.get("podSelector", {}).get("matchLabels", {})
    if not selector or any(pod_labels.get(k) != v for k, v in selector.items()):
        fail(where, "podSelector must select the floodgate pods")
    if "Ingress" not in spec.get("policyTypes", []):
        fail(where, "policyTypes must include Ingress")
    by_port = {}
    for rule in spec.get("ingress", []):
        if not rule.get("from"):
            fail(where, "every ingress rule must name its sources (an empty `from` allows all)")
        for port in rule.get("ports", []):
            by_port.setdefault(port.get("port"), []).extend(rule.get("from", []))
    if set(by_port) != {"grpc", "http-admin"}:
        fail(where, f"ingress must cover exactly the grpc and http-admin ports, not {sorted(by_port)}")
    for source in by_port.get("http-admin", []):
        if source.get("namespaceSelector", {}).get("matchLabels") != {"kubernetes.io/metadata.name": "monitoring"}:
            fail(where, "http-admin must be reachable only from the monitoring namespace")
    for source in by_port.get("grpc", []):
        if "ipBlock" in source or not source.get("namespaceSelector", {}).get("matchLabels"):
            fail(where, "grpc sources must be namespaces selected by label")
    ok(f"{where}: admin from monitoring only, gRPC from {len(by_port.get('grpc', []))} namespace selectors")


def extract_rules(work, render, config_map, listing):
    target = work / "rules" / render
    target.mkdir(parents=True)
    for name, text in sorted((config_map.get("data") or {}).items()):
        if not re.fullmatch(r"[^.].*\.ya?ml", name):
            fail(render, f"ConfigMap {config_map['metadata']['name']} key {name} is not a rule file")
            continue
        (target / name).write_text(text)
        load_rules(target / name, f"{render}: ConfigMap {config_map['metadata']['name']} {name}")
    listing.append(f"{target}\t{render}: ConfigMap {config_map['metadata']['name']}")


def copy_rules(work, name, source, listing):
    target = work / "rules" / name
    target.mkdir(parents=True)
    (target / source.name).write_text(source.read_text())
    listing.append(f"{target}\t{source.relative_to(REPO)}")


# ---------------------------------------------------------------- Istio

def rate_limit_target(config):
    """(domain, cluster_name) of a ratelimit filter config; missing ones are None (and have
    already failed the protoc-gen-validate check)."""
    service = config.get("rate_limit_service", {}).get("grpc_service", {})
    return config.get("domain"), service.get("envoy_grpc", {}).get("cluster_name")


PATCH_TYPES = {
    "HTTP_FILTER": "envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter",
    "VIRTUAL_HOST": "envoy.config.route.v3.VirtualHost",
    "HTTP_ROUTE": "envoy.config.route.v3.Route",
    "CLUSTER": "envoy.config.cluster.v3.Cluster",
}


def check_istio(renders):
    before = len(failures)
    files = sorted((DEPLOY / "istio").glob("envoyfilter-*.yaml"))
    domain, cluster, descriptors = None, None, []
    for path in files:
        where = str(path.relative_to(REPO))
        for obj in load_all(path):
            meta, spec = obj.get("metadata", {}), obj.get("spec", {})
            if (obj.get("apiVersion"), obj.get("kind")) not in CRDS or not meta.get("name") or not meta.get("namespace"):
                fail(where, "needs apiVersion networking.istio.io/v1alpha3, kind EnvoyFilter, name and namespace")
            if not spec.get("configPatches"):
                fail(where, "spec.configPatches is empty")
            for i, patch in enumerate(spec.get("configPatches", [])):
                here = f"{where} configPatches[{i}]"
                apply_to, operation = patch.get("applyTo"), patch.get("patch", {}).get("operation")
                if apply_to not in PATCH_TYPES or not operation or "value" not in patch["patch"]:
                    fail(here, "needs applyTo (a known type), patch.operation and patch.value")
                    continue
                msg = parse_envoy(patch["patch"]["value"], PATCH_TYPES[apply_to], here, complete=operation != "MERGE")
                if msg is None:
                    continue
                if apply_to == "HTTP_FILTER" and patch["patch"]["value"]["name"] == "envoy.filters.http.ratelimit":
                    domain, cluster = rate_limit_target(patch["patch"]["value"]["typed_config"])
                if apply_to == "VIRTUAL_HOST":
                    descriptors += descriptors_of(patch["patch"]["value"].get("rate_limits", []), here)
    if len(failures) == before:
        ok(f"deploy/istio: {len(files)} EnvoyFilters parse as Envoy v3 messages")
    # outbound|<port>||<service>.<namespace>.svc.cluster.local must be the rendered Service.
    found = re.fullmatch(r"outbound\|(\d+)\|\|([^.]+)\.([^.]+)\.svc\.cluster\.local", cluster or "")
    objects = renders.get("istio", [])
    service = find(objects, "Service", found.group(2)) if found else None
    if not found or service is None or service["metadata"].get("namespace") != found.group(3) or int(
            found.group(1)) not in [p["port"] for p in service["spec"]["ports"] if p.get("appProtocol") == "grpc"]:
        fail("deploy/istio", f"cluster_name {cluster} does not name a gRPC port of a Service in the istio render")
    else:
        ok(f"deploy/istio: {cluster} is Service {found.group(2)} in namespace {found.group(3)}")
    check_descriptors("deploy/istio", domain, descriptors, DEPLOY / "istio" / "floodgate-rules.yaml")


# ---------------------------------------------------------------- Envoy bootstrap

def load_bootstrap(name):
    """deploy/envoy/NAME parsed as a strict Envoy Bootstrap: (doc, where, failures before), or
    None when it does not parse (the failure is recorded)."""
    path = DEPLOY / "envoy" / name
    where = str(path.relative_to(REPO))
    (doc,) = load_all(path)
    before = len(failures)
    if parse_envoy(doc, "envoy.config.bootstrap.v3.Bootstrap", where) is None:
        return None
    return doc, where, before


def speaks_http2(cluster):
    """Whether an Envoy cluster (None: missing) is configured for HTTP/2, as gRPC needs."""
    options = (cluster or {}).get("typed_extension_protocol_options", {}).get(
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions", {})
    return cluster is not None and "http2_protocol_options" in options.get("explicit_http_config", {})


def check_envoy():
    loaded = load_bootstrap("envoy.yaml")
    if loaded is None:
        return
    doc, where, before = loaded
    if len(failures) == before:
        ok(f"{where}: a valid envoy.config.bootstrap.v3.Bootstrap")
    clusters = {c["name"]: c for c in doc["static_resources"]["clusters"]}
    domain, descriptors = None, []
    for listener in doc["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for network_filter in chain["filters"]:
                hcm = network_filter["typed_config"]
                for http_filter in hcm.get("http_filters", []):
                    if http_filter["name"] != "envoy.filters.http.ratelimit":
                        continue
                    domain, cluster = rate_limit_target(http_filter["typed_config"])
                    if not speaks_http2(clusters.get(cluster)):
                        fail(where, "the rate_limit_service cluster must exist and speak HTTP/2")
                for vhost in hcm.get("route_config", {}).get("virtual_hosts", []):
                    descriptors += descriptors_of(vhost.get("rate_limits", []), where)
                    for route in vhost.get("routes", []):
                        if route.get("route", {}).get("cluster") not in clusters:
                            fail(where, f"route {route['match']} names an unknown cluster")
                        descriptors += descriptors_of(route.get("route", {}).get("rate_limits", []), where)
    check_descriptors(where, domain, descriptors, DEPLOY / "envoy" / "floodgate-rules.yaml")


def check_envoy_rlqs():
    """The RLQS example: a valid Bootstrap whose quota filter streams to an HTTP/2 cluster,
    and whose bucket ids, pairs sorted by key, each match a limit of the shared rules."""
    loaded = load_bootstrap("envoy-rlqs.yaml")
    if loaded is None:
        return
    doc, where, before = loaded
    clusters = {c["name"]: c for c in doc["static_resources"]["clusters"]}
    rules_path = DEPLOY / "envoy" / "floodgate-rules.yaml"
    rules = load_rules(rules_path, str(rules_path.relative_to(REPO)))
    quota_filters = [f["typed_config"] for listener in doc["static_resources"]["listeners"]
                     for chain in listener["filter_chains"] for network_filter in chain["filters"]
                     for f in network_filter["typed_config"].get("http_filters", [])
                     if f["name"] == "envoy.filters.http.rate_limit_quota"]
    if not quota_filters:
        fail(where, "no envoy.filters.http.rate_limit_quota filter")
    for config in quota_filters:
        if not speaks_http2(clusters.get(config["rlqs_server"]["envoy_grpc"]["cluster_name"])):
            fail(where, "the rlqs_server cluster must exist and speak HTTP/2")
        if config["domain"] != rules["domain"]:
            fail(where, f"domain {config['domain']!r} but the rules declare {rules['domain']!r}")
        matchers = config["bucket_matchers"]
        actions = [m["on_match"]["action"] for m in matchers.get("matcher_list", {}).get("matchers", [])]
        if "on_no_match" in matchers:
            actions.append(matchers["on_no_match"]["action"])
        for action in actions:
            builder = action["typed_config"]["bucket_id_builder"]["bucket_id_builder"]
            entries = [(key, value.get("string_value")) for key, value in sorted(builder.items())]
            if match(rules, entries) is None:
                fail(where, f"bucket id {entries} matches no limit in {rules_path.name}")
    if len(failures) == before:
        ok(f"{where}: a valid Bootstrap whose bucket ids match {rules_path.name}")


# ---------------------------------------------------------------- Dockerfile

def check_dockerfile():
    path = DEPLOY / "docker" / "Dockerfile"
    where = str(path.relative_to(REPO))
    text = re.sub(r"\\\n", " ", path.read_text())
    instructions = [line.strip().split(None, 1) for line in text.splitlines()
                    if line.strip() and not line.lstrip().startswith("#")]
    instructions = [(i[0].upper(), i[1] if len(i) > 1 else "") for i in instructions]
    stages, current = [], None
    for op, rest in instructions:
        if op == "FROM":
            named = re.search(r"\s+AS\s+(\S+)", rest, re.IGNORECASE)
            current = {"name": named.group(1) if named else None, "ops": []}
            stages.append(current)
        elif current is not None:
            current["ops"].append((op, rest))
    if len(stages) < 2 or not stages[0]["name"]:
        fail(where, "needs a named builder stage and a runtime stage")
        return
    builder, runtime = stages[0], stages[-1]
    builds = [rest for op, rest in builder["ops"] if op == "RUN" and "cargo build" in rest]
    if not builds or not all("--release" in b and "--locked" in b for b in builds):
        fail(where, "the builder must run cargo build --release --locked")
    users = [rest for op, rest in runtime["ops"] if op == "USER"]
    if not users or users[-1].split(":")[0] in ("root", "0"):
        fail(where, "the runtime stage must switch to a non-root USER")
    exposed = " ".join(rest for op, rest in runtime["ops"] if op == "EXPOSE").split()
    if not {"8080", "8081"} <= set(exposed):
        fail(where, "the runtime stage must EXPOSE 8080 8081")
    entrypoint = [rest for op, rest in runtime["ops"] if op == "ENTRYPOINT"]
    if not entrypoint or not entrypoint[-1].startswith("[") or "floodgate" not in json.loads(entrypoint[-1])[0]:
        fail(where, "ENTRYPOINT must be the floodgate binary in exec form (the image has no shell)")
    if ("ENV", "FLOODGATE_CONFIG=/etc/floodgate/config") not in runtime["ops"]:
        fail(where, "the runtime stage must set FLOODGATE_CONFIG=/etc/floodgate/config")
    names = {s["name"] for s in stages if s["name"]}
    for op, rest in runtime["ops"]:
        source = re.search(r"--from=(\S+)", rest)
        if op == "COPY" and source and source.group(1) not in names:
            fail(where, f"COPY --from={source.group(1)} names no stage")
    for stage in stages:
        for op, rest in stage["ops"]:
            if op == "COPY" and "--from=" not in rest:
                for item in rest.split()[:-1]:
                    if item != "." and not item.startswith("--") and not (REPO / item).exists():
                        print(f"WARN {where}: COPY source {item} is not in the repository yet;"
                              " `docker build` fails until it is")
    ignored = (REPO / ".dockerignore").read_text().split() if (REPO / ".dockerignore").exists() else []
    if not {"target/", ".git/"} <= set(ignored):
        fail(".dockerignore", "must exclude target/ and .git/")
    ok(f"{where}: stages {[s['name'] or '(runtime)' for s in stages]}, --locked build, non-root runtime")

# ---------------------------------------------------------------- Envoy Gateway

def dockerfile_entrypoint():
    text = (DEPLOY / "docker" / "Dockerfile").read_text()
    found = re.findall(r"^ENTRYPOINT\s+(\[.*\])\s*$", text, re.MULTILINE)
    return json.loads(found[-1]) if found else None


def check_envoy_gateway(work):
    """Applies the EnvoyGateway rate-limit patch, as Envoy Gateway does, to the Deployment
    it generates (testdata/), and checks floodgate runs there with Envoy Gateway's env and
    TLS mounts intact. The result joins native/ for the Kubernetes schema check."""
    where = "deploy/envoy-gateway"
    (config_map,) = load_all(DEPLOY / "envoy-gateway" / "envoy-gateway-config.yaml")
    gateway = yaml.safe_load(config_map["data"]["envoy-gateway.yaml"])
    if (gateway.get("apiVersion"), gateway.get("kind")) != ("gateway.envoyproxy.io/v1alpha1", "EnvoyGateway"):
        fail(where, "envoy-gateway.yaml must be a gateway.envoyproxy.io/v1alpha1 EnvoyGateway")
        return
    deployment_spec = gateway.get("provider", {}).get("kubernetes", {}).get("rateLimitDeployment", {})
    image = deployment_spec.get("container", {}).get("image", "")
    if not image.split("/")[-1].startswith("floodgate"):
        fail(where, f"rateLimitDeployment.container.image {image!r} is not a floodgate image")
    patch = deployment_spec.get("patch", {})
    if patch.get("type") != "StrategicMerge":
        fail(where, "rateLimitDeployment.patch must be a StrategicMerge patch")
        return
    if gateway.get("rateLimit", {}).get("backend", {}).get("type") != "Redis":
        fail(where, "rateLimit.backend.type must be Redis (Envoy Gateway's only backend)")
    (generated,) = load_all(DEPLOY / "envoy-gateway" / "testdata" / "envoy-ratelimit-deployment.yaml")
    generated["spec"]["template"]["spec"]["containers"][0]["image"] = image  # as Envoy Gateway sets it
    if shutil.which("kubectl") is None:
        ok(f"{where}: kubectl missing, patch not applied (config checked only)")
        return
    source = work / "envoy-gateway-generated.yaml"
    source.write_text(yaml.safe_dump(generated, sort_keys=False))
    patched = subprocess.run(
        ["kubectl", "patch", "--local", "-f", str(source), "--type", "strategic",
         "-p", json.dumps(patch.get("value", {})), "-o", "yaml"],
        capture_output=True, text=True, check=False)
    if patched.returncode != 0:
        fail(where, f"kubectl cannot apply the patch: {patched.stderr.strip()}")
        return
    result = yaml.safe_load(patched.stdout)
    before = generated["spec"]["template"]["spec"]
    after = result["spec"]["template"]["spec"]
    (container,) = [c for c in after["containers"] if c["name"] == "envoy-ratelimit"]
    if container.get("image") != image:
        fail(where, "the patched container does not run the floodgate image")
    entrypoint = dockerfile_entrypoint()
    if container.get("command") != entrypoint:
        fail(where, f"command {container.get('command')} must be the image's entrypoint {entrypoint}")
    kept = [e["name"] for e in before["containers"][0]["env"]]
    now = [e["name"] for e in container.get("env", [])]
    if now[:len(kept)] != kept:
        fail(where, "the patch must keep Envoy Gateway's environment variables")
    mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in after.get("volumes", [])}
    if mounts.get("/certs") != "certs" or volumes.get("certs", {}).get("secret", {}).get("secretName") != "envoy-rate-limit":
        fail(where, "the patch must keep the envoy-rate-limit TLS Secret mounted at /certs")
    readiness = container.get("readinessProbe", {}).get("httpGet", {})
    if (readiness.get("path"), readiness.get("port")) != ("/healthcheck", 8080):
        fail(where, "readiness must stay GET /healthcheck on 8080 (floodgate's admin port)")
    liveness = container.get("livenessProbe", {}).get("httpGet", {})
    if (liveness.get("path"), liveness.get("port")) != ("/livez", 8080):
        fail(where, "liveness must be GET /livez on 8080: /healthcheck drops while Redis is down")
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    if env.get("CONFIG_TYPE") != "GRPC_XDS_SOTW":
        fail(where, "Envoy Gateway feeds the rules over xDS (CONFIG_TYPE=GRPC_XDS_SOTW)")
    (work / "native" / "envoy-gateway-patched.yaml").write_text(yaml.safe_dump(result, sort_keys=False))
    ok(f"{where}: patch applied; floodgate image and command, {len(kept)} env vars and /certs kept, probes")


# ---------------------------------------------------------------- AI Gateway token budgets

# A global rate-limit rule of Envoy Gateway's BackendTrafficPolicy, field by field as
# envoyproxy/gateway api/v1alpha1/ratelimit_types.go declares them (RateLimitRule,
# RateLimitSelectCondition, HeaderMatch, RateLimitValue, RateLimitCost,
# RateLimitCostSpecifier, RateLimitCostMetadata); `limit.fromMetadata` from
# internal/gatewayapi/backendtrafficpolicy.go (buildRateLimitRule). No schema check sees these
# CRDs, so a misspelt field would otherwise be pruned by the API server without a word.
# deploy/ai-gateway is written against v1.6.0 (commit fca7a8d9, which carries
# release-notes/v1.6.0.yaml); `shadowMode` and `limit.fromMetadata` are later additions.
EG_RULE_FIELDS = {"clientSelectors", "limit", "cost", "shared", "shadowMode"}
EG_SELECTOR_FIELDS = {"headers", "methods", "path", "sourceCIDR"}
EG_HEADER_FIELDS = {"name", "type", "value", "invert"}
EG_HEADER_TYPES = {"Exact", "RegularExpression", "Distinct"}
EG_LIMIT_FIELDS = {"requests", "unit", "fromMetadata"}
EG_UNITS = {"Second", "Minute", "Hour", "Day", "Month", "Year"}
EG_COST_FIELDS = {"request", "response"}
EG_COST_SPEC_FIELDS = {"from", "number", "metadata"}
EG_METADATA_FIELDS = {"namespace", "key"}
# envoyproxy/ai-gateway api/v1beta1/shared_types.go: AIGatewayFilterMetadataNamespace.
AI_GATEWAY_METADATA = "io.envoy.ai_gateway"


def unknown_fields(where, value, allowed):
    if not isinstance(value, dict):
        fail(where, f"must be a mapping, not {value!r}")
        return True
    for field in sorted(set(value) - allowed):
        fail(where, f"unknown field {field} (Envoy Gateway declares {sorted(allowed)})")
    return False


def check_cost_spec(where, spec):
    if unknown_fields(where, spec, EG_COST_SPEC_FIELDS):
        return
    source = spec.get("from")
    if source == "Number":
        if not isinstance(spec.get("number"), int) or spec["number"] < 0 or "metadata" in spec:
            fail(where, "from: Number needs a `number` >= 0 and no `metadata`")
    elif source == "Metadata":
        metadata = spec.get("metadata")
        if "number" in spec or not isinstance(metadata, dict) or set(metadata) != EG_METADATA_FIELDS:
            fail(where, "from: Metadata needs `metadata: {namespace, key}` and no `number`")
    else:
        fail(where, f"from must be Number or Metadata, not {source!r}")


def check_rate_limit_rule(where, rule, written_keys):
    """One global rule; returns nothing, records failures."""
    if unknown_fields(where, rule, EG_RULE_FIELDS):
        return
    for flag in ("shared", "shadowMode"):
        if flag in rule and not isinstance(rule[flag], bool):
            fail(where, f"{flag} must be true or false, not {rule[flag]!r}")
    for i, selector in enumerate(rule.get("clientSelectors") or []):
        here = f"{where} clientSelectors[{i}]"
        if unknown_fields(here, selector, EG_SELECTOR_FIELDS):
            continue
        if not selector:
            fail(here, "needs at least one of headers, methods, path, sourceCIDR")
        for j, header in enumerate(selector.get("headers") or []):
            there = f"{here} headers[{j}]"
            if unknown_fields(there, header, EG_HEADER_FIELDS):
                continue
            kind = header.get("type", "Exact")
            if not header.get("name") or kind not in EG_HEADER_TYPES:
                fail(there, f"needs a name and a type in {sorted(EG_HEADER_TYPES)}")
            elif (kind == "Distinct") == ("value" in header):
                fail(there, "Distinct takes no value; Exact and RegularExpression need one")
            elif kind == "Distinct" and header.get("invert"):
                fail(there, "invert does not apply to Distinct")
    limit = rule.get("limit")
    if not unknown_fields(f"{where} limit", limit, EG_LIMIT_FIELDS):
        if not isinstance(limit.get("requests"), int) or limit["requests"] < 0 or limit.get("unit") not in EG_UNITS:
            fail(f"{where} limit", f"needs requests >= 0 and a unit in {sorted(EG_UNITS)}")
        if "fromMetadata" in limit and set(limit["fromMetadata"] or {}) != EG_METADATA_FIELDS:
            fail(f"{where} limit.fromMetadata", "needs exactly namespace and key")
    cost = rule.get("cost")
    if cost is None or unknown_fields(f"{where} cost", cost, EG_COST_FIELDS):
        return
    for phase in sorted(set(cost) & EG_COST_FIELDS):
        check_cost_spec(f"{where} cost.{phase}", cost[phase])
    response, request = cost.get("response") or {}, cost.get("request")
    metadata = response.get("metadata") or {}
    if metadata.get("namespace") == AI_GATEWAY_METADATA and metadata.get("key") not in written_keys:
        fail(f"{where} cost.response", f"reads {AI_GATEWAY_METADATA}/{metadata.get('key')}, which no "
             f"AIGatewayRoute llmRequestCosts writes ({sorted(written_keys)})")
    # Envoy Gateway's default request cost is 1: without an explicit 0 every request would
    # book a token of its own besides asking (docs/cost-budgets.md#the-two-phase-flow).
    if response and request != {"from": "Number", "number": 0}:
        fail(f"{where} cost.request", "a rule charged on the response must ask first: {from: Number, number: 0}")


# Header values a tenant header carries; a rule that budgets requests *without* the header
# must not match any of them. Envoy Gateway's regexes are RE2; these patterns are plain
# enough to read the same in Python.
SAMPLE_TENANTS = ("acme", "tenant-42", "x", "Org/Team:9")


def header_matches(rule):
    """Every header match of a rule, over all its client selectors."""
    return [h for s in rule.get("clientSelectors") or [] if isinstance(s, dict)
            for h in s.get("headers") or [] if isinstance(h, dict)]


def tenant_headers(rule):
    """The headers a rule keeps a budget per value of (type Distinct): a per-tenant rule."""
    return {str(h.get("name") or "").lower() for h in header_matches(rule) if h.get("type") == "Distinct"}


def absent_header(rule):
    """The header whose absence alone selects this rule, or None.

    Envoy Gateway turns an inverted match into a header_value_match action with
    expect_match false (internal/xds/translator/ratelimit.go), and an absent header fails any
    value match in Envoy, so `invert: true` on a regex that matches every value holds exactly
    when the header is missing (or, for `.+`, empty). The rule must select on nothing else,
    or it would budget only some of those requests."""
    selectors = rule.get("clientSelectors") or []
    if len(selectors) != 1 or not isinstance(selectors[0], dict) or set(selectors[0]) != {"headers"}:
        return None
    headers = selectors[0]["headers"] or []
    if len(headers) != 1 or not isinstance(headers[0], dict):
        return None
    (header,) = headers
    if header.get("type") != "RegularExpression" or header.get("invert") is not True:
        return None
    try:
        if not all(re.fullmatch(str(header.get("value")), value) for value in SAMPLE_TENANTS):
            return None
    except re.error:
        return None
    return str(header.get("name") or "").lower()


def check_tenant_budgets(where, rules):
    """One budget per tenant across the route's rules, and one for requests without a tenant.

    Envoy Gateway keys a rule that is not `shared` by the Envoy route (one per HTTPRoute rule,
    match and hostname; AI Gateway makes an HTTPRoute rule of each AIGatewayRoute rule), so an
    unshared per-tenant rule is a budget per tenant *per model*. And Envoy drops a descriptor
    whose request_headers action finds no header: without a rule for the header's absence,
    requests without it are never budgeted (docs/cost-budgets.md#shared-and-unshared-rules)."""
    any_shared = any(isinstance(rule, dict) and rule.get("shared") is True for rule in rules)
    for i, rule in enumerate(rules):
        if not isinstance(rule, dict):
            continue
        here = f"{where} rules[{i}]"
        shared = rule.get("shared") is True
        names = tenant_headers(rule)
        if names and not shared:
            fail(here, f"a per-tenant budget ({', '.join(sorted(names))}) must be `shared: true`: "
                 "unshared, Envoy Gateway keeps it per route, one budget per tenant for each model")
        elif (rule.get("cost") or {}).get("response") and not shared:
            fail(here, "a token budget must be `shared: true`: unshared, Envoy Gateway keeps it per route"
                 + (" (and v1.6.0 sends it to the shared rules' domain, where it matches nothing)"
                    if any_shared else ""))
    defaults = {}
    for rule in rules:
        if isinstance(rule, dict) and rule.get("shared") is True and absent_header(rule):
            defaults.setdefault(absent_header(rule), []).append(rule)
    for i, rule in enumerate(rules):
        if not isinstance(rule, dict):
            continue
        response = (rule.get("cost") or {}).get("response")
        for name in sorted(tenant_headers(rule)):
            caught = [d for d in defaults.get(name, []) if (d.get("cost") or {}).get("response") == response]
            if not caught:
                fail(f"{where} rules[{i}]", f"requests without {name} are never budgeted: add a shared rule "
                     f"selecting only {{name: {name}, type: RegularExpression, value: \".+\", invert: true}}, "
                     "charged as this rule is")


def check_ai_gateway(renders):
    """deploy/ai-gateway: the token-budget policy and the route whose token counts it reads."""
    objects = renders.get("ai-gateway", [])
    where = "deploy/ai-gateway"
    before = len(failures)
    routes = [o for o in objects if o.get("kind") == "AIGatewayRoute"]
    policies = [o for o in objects if o.get("kind") == "BackendTrafficPolicy"]
    if not routes or not policies:
        fail(where, "needs an AIGatewayRoute and a BackendTrafficPolicy")
        return
    written, gateways, rules = set(), set(), 0
    for route in routes:
        name = f"{where}: AIGatewayRoute {route['metadata']['name']}"
        for i, entry in enumerate(route.get("spec", {}).get("llmRequestCosts") or []):
            if not entry.get("metadataKey") or not entry.get("type"):
                fail(f"{name} llmRequestCosts[{i}]", "needs metadataKey and type")
            written.add(entry.get("metadataKey"))
        for parent in route.get("spec", {}).get("parentRefs") or []:
            if parent.get("kind", "Gateway") == "Gateway":
                gateways.add((route["metadata"].get("namespace"), parent.get("name")))
    for policy in policies:
        name = f"{where}: BackendTrafficPolicy {policy['metadata']['name']}"
        spec = policy.get("spec", {})
        namespace = policy["metadata"].get("namespace")
        for ref in spec.get("targetRefs") or []:
            if ref.get("kind") == "Gateway" and (namespace, ref.get("name")) not in gateways:
                fail(name, f"targets Gateway {ref.get('name')}, which no AIGatewayRoute here attaches to")
        rate_limit = spec.get("rateLimit") or {}
        if unknown_fields(f"{name} rateLimit", rate_limit, {"type", "global", "local"}):
            continue
        if rate_limit.get("type", "Global") != "Global" or not (rate_limit.get("global") or {}).get("rules"):
            fail(name, "token budgets need global rules (a response cost is global-only)")
            continue
        for i, rule in enumerate(rate_limit["global"]["rules"]):
            check_rate_limit_rule(f"{name} rules[{i}]", rule, written)
            rules += 1
        check_tenant_budgets(name, rate_limit["global"]["rules"])
    if len(failures) == before:
        ok(f"{where}: {rules} global rules, token budgets shared, requests without a tenant budgeted, "
           f"costs read from {AI_GATEWAY_METADATA} keys {sorted(written)}")


# ---------------------------------------------------------------- AI Gateway's QuotaPolicy

# Where AI Gateway's Envoy calls its quota rate-limit service, and where that service takes its
# rules from (envoyproxy/ai-gateway):
# - manifests/charts/ai-gateway-helm/values.yaml (commit 039ba6bc):
#   controller.quotaRateLimitServiceHost "envoy-ai-gateway-ratelimit.envoy-gateway-system";
#   the controller Service, fullnameOverride ai-gateway-controller, port ratelimit-xds 18002;
# - internal/extensionserver/quota_ratelimit.go (commit 31d1f94a):
#   defaultQuotaRateLimitServicePort 8081;
# - internal/ratelimit/runner/runner.go (commit 7b0c8f06): NodeID "envoy-ai-gateway-ratelimit",
#   DefaultPort 18002, an ADS server with no TLS (grpc.NewServer());
# - tests/e2e/testdata/backend_quota_ratelimit.yaml (commit 2e78aec0): the reference service's
#   CONFIG_GRPC_XDS_SERVER_URL ai-gateway-controller.envoy-ai-gateway-system.svc.cluster.local:18002.
QUOTA_SERVICE = ("envoy-ai-gateway-ratelimit", "envoy-gateway-system", 8081)
QUOTA_XDS_HOST = "ai-gateway-controller.envoy-ai-gateway-system"
QUOTA_XDS_PORT = 18002
QUOTA_NODE_ID = "envoy-ai-gateway-ratelimit"


def xds_host_port(server):
    """(host, port, tls) of an --xds-server value: `host:port` or an `http(s)://` URL."""
    found = re.fullmatch(r"(?:(https?)://)?(?:[^@/]*@)?([^:/]+):(\d+)/?", server or "")
    if not found:
        return None, None, False
    return found.group(2), int(found.group(3)), found.group(1) == "https"


def check_ai_gateway_quota(renders):
    """deploy/ai-gateway-quota: floodgate as AI Gateway's envoy-ai-gateway-ratelimit, taking
    the QuotaPolicy rules over xDS from AI Gateway's controller."""
    where = "deploy/ai-gateway-quota"
    objects = renders.get("ai-gateway-quota")
    if objects is None:
        fail(where, "not rendered (no kustomization.yaml?)")
        return
    before = len(failures)
    name, namespace, port = QUOTA_SERVICE
    deployment = find(objects, "Deployment", "floodgate")
    service = find(objects, "Service", name)
    if deployment is None or service is None:
        fail(where, f"needs the Deployment floodgate and the Service {name}")
        return
    pod = deployment["spec"]["template"]
    (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "floodgate"]
    # The Service: the name, namespace and port AI Gateway's Envoy dials, onto floodgate's pods.
    if service["metadata"].get("namespace") != namespace:
        fail(f"{where}: Service {name}", f"must be in namespace {namespace}, not {service['metadata'].get('namespace')}")
    if deployment["metadata"].get("namespace") != service["metadata"].get("namespace"):
        fail(f"{where}: Service {name}", "must be in the Deployment's namespace (a selector does not cross namespaces)")
    ports = [p for p in service["spec"].get("ports", []) if p.get("port") == port]
    if len(ports) != 1 or ports[0].get("appProtocol") != "grpc" or ports[0].get("protocol", "TCP") != "TCP":
        fail(f"{where}: Service {name}", f"needs port {port}, TCP, appProtocol grpc")
    else:
        grpc_addr = next((e.get("value") for e in container.get("env", []) if e["name"] == "FLOODGATE_GRPC_ADDR"), ":8081")
        target = ports[0].get("targetPort", port)
        if port_number(container, target) != int(str(grpc_addr).rsplit(":", 1)[1]):
            fail(f"{where}: Service {name}", f"targetPort {target} is not floodgate's gRPC port ({grpc_addr})")
    selector = service["spec"].get("selector") or {}
    labels = pod["metadata"].get("labels", {})
    if not selector or any(labels.get(k) != v for k, v in selector.items()):
        fail(f"{where}: Service {name}", f"selector {selector} does not select floodgate's pods {labels}")
    # Rules over xDS from AI Gateway's controller: source, server, node id, plaintext.
    source, source_from = container_setting(container, "config_source")
    if config_source(container) != "xds":
        fail(f"{where}: Deployment floodgate", f"config source is {source or 'file (default)'}: the rules "
             "come from AI Gateway over xDS (FLOODGATE_CONFIG_SOURCE=xds or CONFIG_TYPE=GRPC_XDS_SOTW)")
    server, server_from = container_setting(container, "xds_server")
    host, server_port, https = xds_host_port(server)
    if host is None or not (host == QUOTA_XDS_HOST or host.startswith(QUOTA_XDS_HOST + ".")) \
            or server_port != QUOTA_XDS_PORT:
        fail(f"{where}: Deployment floodgate", f"xDS server {server!r} must be {QUOTA_XDS_HOST}[.svc...]:"
             f"{QUOTA_XDS_PORT}, AI Gateway's controller")
    node_id, node_from = container_setting(container, "xds_node_id")
    if node_id != QUOTA_NODE_ID:
        fail(f"{where}: Deployment floodgate", f"xDS node id {node_id!r} (default `default`) must be "
             f"{QUOTA_NODE_ID}: AI Gateway's controller keeps its snapshot under that id only")
    tls, _ = container_setting(container, "xds_tls")
    if https or (tls or "").lower() in TRUTHY:
        fail(f"{where}: Deployment floodgate", "AI Gateway's rate-limit xDS server has no TLS: leave --xds-tls off")
    # No QuotaPolicy, no snapshot: without force start the ports stay closed and the liveness
    # probe restarts the pods.
    force, _ = container_setting(container, "force_start")
    if (force or "").lower() not in TRUTHY:
        fail(f"{where}: Deployment floodgate", "needs --force-start-without-initial-config: AI Gateway sends "
             "nothing until a QuotaPolicy exists, and the closed ports would fail the liveness probe")
    # The end-of-stream charge is booked only under consume (docs/cost-budgets.md).
    accounting, _ = container_setting(container, "on_over_limit")
    if accounting not in (None, "consume"):
        fail(f"{where}: Deployment floodgate", f"--on-over-limit {accounting}: AI Gateway's end-of-stream "
             "costs need `consume`, the default for rules over xDS")
    # The Envoy proxies (envoy-gateway-system by default) may reach the gRPC port.
    policy = find(objects, "NetworkPolicy", "floodgate")
    grpc_sources = [s for rule in (policy or {}).get("spec", {}).get("ingress", [])
                    if any(p.get("port") in ("grpc", port) for p in rule.get("ports", []))
                    for s in rule.get("from", [])]
    if not any(s.get("namespaceSelector", {}).get("matchLabels") == {"kubernetes.io/metadata.name": namespace}
               and "podSelector" not in s for s in grpc_sources):
        fail(f"{where}: NetworkPolicy floodgate", f"gRPC must be open to namespace {namespace}, where Envoy "
             "Gateway runs AI Gateway's Envoy proxies")
    # envoy-gateway-system is Envoy Gateway's: this kustomization must not own it.
    for obj in objects:
        if obj.get("kind") == "Namespace":
            fail(where, f"renders Namespace {obj['metadata']['name']}: {namespace} belongs to Envoy Gateway's install")
    if len(failures) == before:
        ok(f"{where}: Service {name}.{namespace}:{port} (gRPC) -> floodgate; rules over xDS ({source_from}) "
           f"from {server} ({server_from}), node id {node_id} ({node_from}), no TLS")


def check_observability():
    for path in sorted((DEPLOY / "grafana").glob("*.json")):
        where = path.relative_to(REPO)
        try:
            dashboard = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            fail(where, f"invalid JSON: {error}")
            continue
        variables = {v.get("name") for v in dashboard.get("templating", {}).get("list", [])}
        panels = dashboard.get("panels", [])
        if not panels or not dashboard.get("uid"):
            fail(where, "a dashboard needs a uid and panels")
        for panel in panels:
            title = panel.get("title", panel.get("id"))
            uid = panel.get("datasource", {}).get("uid", "")
            if uid.strip("${}") not in variables:
                fail(where, f"panel {title!r}: data source {uid!r} is not a dashboard variable")
            if not panel.get("targets") or not all(t.get("expr") for t in panel["targets"]):
                fail(where, f"panel {title!r}: every target needs a PromQL `expr`")
        ok(f"{where}: {len(panels)} panels")
    for path in sorted((DEPLOY / "prometheus").glob("*.yaml")):
        where = path.relative_to(REPO)
        groups = (yaml.safe_load(path.read_text()) or {}).get("groups") or []
        alerts = [rule for group in groups for rule in group.get("rules") or []]
        if not alerts:
            fail(where, "no rules")
        for rule in alerts:
            name = rule.get("alert") or rule.get("record")
            if not name or not rule.get("expr"):
                fail(where, f"rule {name!r} needs a name and an `expr`")
            if rule.get("alert") and not (rule.get("labels", {}).get("severity")
                                          and rule.get("annotations", {}).get("summary")):
                fail(where, f"alert {name!r} needs labels.severity and annotations.summary")
        ok(f"{where}: {len(alerts)} rules")


def main():
    work = pathlib.Path(sys.argv[1])
    renders = split_renders(work)
    listing = []
    for render, objects in renders.items():
        check_service(render, objects)
        check_network_policy(render, objects)
        config_map = check_floodgate(render, objects)
        if config_map is not None:
            extract_rules(work, render, config_map, listing)
    check_istio(renders)
    check_envoy()
    check_envoy_rlqs()
    copy_rules(work, "example-istio", DEPLOY / "istio" / "floodgate-rules.yaml", listing)
    copy_rules(work, "example-envoy", DEPLOY / "envoy" / "floodgate-rules.yaml", listing)
    check_dockerfile()
    check_observability()
    check_envoy_gateway(work)
    check_ai_gateway(renders)
    check_ai_gateway_quota(renders)
    (work / "rules.txt").write_text("".join(line + "\n" for line in listing))
    for line in failures:
        print(f"FAIL {line}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

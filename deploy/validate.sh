#!/usr/bin/env bash
# Validates everything under deploy/ offline (after a one-time pip install).
#
#   deploy/validate.sh [path/to/floodgate]
#
# 1. yamllint over every YAML file in deploy/ (deploy/.yamllint);
# 2. renders every kustomization under deploy/ with `kubectl kustomize` (components inside
#    the overlays that use them);
# 3. deploy/checks.py: CRDs (EnvoyFilter) and the Envoy bootstrap parsed as Envoy v3
#    protos, the Deployment's probe/drain/mount contract, the Istio cluster name against
#    the rendered Service, descriptors sent vs. rules, the Dockerfile, the Grafana
#    dashboards (JSON), the Prometheus alert rules (`promtool check rules` too when
#    promtool is installed), the Envoy Gateway patch applied (`kubectl patch --local`)
#    to the Deployment Envoy Gateway generates, and the AI Gateway token budgets (the
#    BackendTrafficPolicy's fields as Envoy Gateway declares them, its costs against the
#    AIGatewayRoute's llmRequestCosts), and floodgate as AI Gateway's QuotaPolicy service
#    (deploy/ai-gateway-quota: the Service envoy-ai-gateway-ratelimit.envoy-gateway-system:8081,
#    rules over xDS from AI Gateway's controller on 18002, node id envoy-ai-gateway-ratelimit);
# 4. validates every rendered Kubernetes object against the API schemas, strictly (unknown
#    fields fail), for the newest Kubernetes and for the oldest one the manifests support;
# 5. `sh -n` over the shell scripts;
# 6. lists the floodgate rule directories (the ConfigMaps' rules and the Istio and Envoy
#    examples) and, given a floodgate binary, runs `floodgate check-config` on each.
set -euo pipefail

floodgate=${1:-}
if [[ -n $floodgate ]]; then
  # Resolve before changing directory; a bare name is looked up on PATH.
  [[ $floodgate == */* ]] || floodgate=$(command -v "$floodgate" || echo "$floodgate")
  floodgate=$(realpath "$floodgate")
  [[ -x $floodgate ]] || { echo "not an executable: $1" >&2; exit 1; }
fi
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# The oldest Kubernetes these manifests are written for: the preStop sleep action is on by
# default from 1.30.
min_kubernetes=1.30.0
started=$SECONDS
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

step() { printf '\n== %s\n' "$*"; }

step "tools"
# The Python tools come from PyPI. Where pip may not install into the system Python
# (PEP 668), they go into a virtualenv in the user's cache, reused on later runs.
py=python3
venv=${XDG_CACHE_HOME:-$HOME/.cache}/floodgate-deploy-venv
[[ -x $venv/bin/python3 ]] && py=$venv/bin/python3
missing=()
"$py" -c 'import kubernetes_validate' 2>/dev/null || missing+=(kubernetes-validate)
"$py" -c 'import yamllint' 2>/dev/null || missing+=(yamllint)
"$py" -c 'import envoy.config.bootstrap.v3.bootstrap_pb2' 2>/dev/null || missing+=(xds-protos)
if ((${#missing[@]})); then
  echo "installing ${missing[*]}"
  if ! "$py" -m pip install --quiet --disable-pip-version-check "${missing[@]}"; then
    echo "pip cannot install here; using a virtualenv at $venv"
    python3 -m venv "$venv"
    py=$venv/bin/python3
    "$py" -m pip install --quiet --disable-pip-version-check kubernetes-validate yamllint xds-protos
  fi
fi
if command -v kubectl >/dev/null; then
  kustomize=(kubectl kustomize)
elif command -v kustomize >/dev/null; then
  kustomize=(kustomize build)
else
  echo "neither kubectl nor kustomize is installed" >&2
  exit 1
fi
echo "${kustomize[*]}; kubernetes-validate $("$py" -m kubernetes_validate --version 2>&1 | head -1)"

step "yamllint (syntax, duplicate keys, indentation)"
"$py" -m yamllint -c deploy/.yamllint deploy
echo "ok   $(find deploy -name '*.yaml' -o -name '*.yml' -o -name .yamllint | wc -l) files"

step "render every kustomization"
mkdir -p "$work/render"
while IFS= read -r file; do
  dir=${file%/kustomization.yaml}
  # A component is rendered inside the overlays that use it, never alone.
  if grep -q '^kind: Component' "$file"; then
    echo "ok   $dir (component)"
    continue
  fi
  slug=${dir#deploy/}
  slug=${slug//\//-}
  "${kustomize[@]}" "$dir" >"$work/render/$slug.yaml"
  echo "ok   $dir"
done < <(find deploy -name kustomization.yaml | sort)

step "floodgate contract, CRDs, Envoy protos, descriptors vs. rules, Dockerfile"
"$py" deploy/checks.py "$work"

if command -v promtool >/dev/null; then
  step "promtool check rules"
  promtool check rules deploy/prometheus/*.yaml
fi

step "Kubernetes schemas (--strict), $min_kubernetes and newest"
for version in "$min_kubernetes" ""; do
  "$py" -m kubernetes_validate --strict --quiet ${version:+-k "$version"} "$work"/native/*.yaml
done
echo "ok   $(grep -c '^kind:' "$work"/native/*.yaml | awk -F: '{ n += $2 } END { print n }') objects"

step "shell syntax"
while IFS= read -r script; do
  sh -n "$script"
  echo "ok   $script"
done < <(find deploy -name '*.sh' ! -name validate.sh | sort)
bash -n deploy/validate.sh

step "floodgate rule files"
# rules.txt: one rule directory per line (a temporary copy), tab, where its files come from.
invalid=0
while IFS=$'\t' read -r dir source; do
  if [[ -n $floodgate ]]; then
    printf '%s: ' "$source"
    "$floodgate" check-config "$dir" || invalid=1
  else
    echo "$source: $(cd "$dir" && echo *)"
  fi
done <"$work/rules.txt"
if [[ -z $floodgate ]]; then
  echo "(no floodgate binary given: \`deploy/validate.sh target/release/floodgate\` runs check-config on each)"
elif ((invalid)); then
  echo "floodgate check-config rejected the rules above" >&2
  exit 1
fi

printf '\nall deploy/ checks passed in %ss\n' "$((SECONDS - started))"

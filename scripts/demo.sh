#!/usr/bin/env bash
# `make demo`: the main job on the bundled example org, step by step.
set -euo pipefail
cd "$(dirname "$0")/.."

n=0
step() { n=$((n + 1)); printf '\n\033[1m== %d. %s\033[0m\n' "$n" "$*"; }

step "Check the example org's config tree (policies/ quotas/ rbac/ networkpolicies/)"
mpigate check .

step "The teams it defines"
mpigate check . -o json | python3 -c '
import json, sys
data = json.load(sys.stdin)
print("revision:", data["revision"])
print("files:   ", len(data["files"]), "config files,", data["documents"], "documents")
print("teams:   ", ", ".join(data["teams"]))
'

step "What an admin sees when a pull request breaks the config"
rm -rf build/demo-broken && mkdir -p build && mpigate init build/demo-broken --example >/dev/null
sed -i 's/nominal: 16/nominal: "16"/; s/maxNodesPerJob: 4/maxNodesPerJb: 4/' build/demo-broken/quotas/nlp-team.yaml
sed -i 's/team: cv-team/team: cv-teem/' build/demo-broken/rbac/cv-team.yaml
sed -i 's/namespaces: \[research\]/namespaces: [research, nlp-team]/' build/demo-broken/quotas/research-team.yaml
if mpigate check build/demo-broken; then echo "unexpected: the broken tree passed"; exit 1; fi
echo "(exit status 1: the pull request's CI job fails with every problem listed)"

step "Run the org's policy test suites (what CI runs on every pull request)"
mpigate test .

step "What the admission webhook answers for an allowed job (with the mutation it adds)"
mpigate explain examples/trainjobs/minimal.yaml

step "... and for a denied one"
if mpigate explain examples/trainjobs/deny-over-quota.yaml; then echo "unexpected: the job was allowed"; exit 1; fi
echo "(exit status 1: denied, with the numbers and the fix)"

step "Render the example org into manifests for Argo CD / Flux (build/deploy/)"
mkdir -p build
mpigate render . -o build/deploy
echo "(per directory: the objects written, by kind; kustomization.yaml at each level)"

step "What a quota change would do in the cluster (mpigate diff, as in a pull request)"
rm -rf build/demo-diff && mpigate init build/demo-diff --example >/dev/null
mpigate render build/demo-diff -o build/demo-diff-deploy >/dev/null
sed -i 's/nominal: 16/nominal: 20/' build/demo-diff/quotas/nlp-team.yaml
if mpigate diff build/demo-diff --against build/demo-diff-deploy; then echo "unexpected: no change"; exit 1; fi
echo "(exit status 1: the render would change these objects)"

step "The admission webhook: generate certificates, start it, replay every example through it"
rm -rf build/demo-webhook && mkdir -p build/demo-webhook
# A CA and a serving certificate (in a cluster without cert-manager these go into a Secret and
# the caBundle into the webhook configurations); 127.0.0.1 is added for this local run.
mpigate certs --out build/demo-webhook/certs --extra-name 127.0.0.1 > build/demo-webhook/ca-bundle
# the org signs checkpoints with ed25519: the webhook holds the private key, auditors the public one
mpigate audit keygen build/demo-webhook/audit.key --public build/demo-webhook/audit.pub --config . > /dev/null
mpigate serve --config . --host 127.0.0.1 --port 0 --no-live \
  --tls-cert build/demo-webhook/certs/tls.crt --tls-key build/demo-webhook/certs/tls.key \
  --audit-dir build/demo-webhook/audit --audit-key build/demo-webhook/audit.key \
  2> build/demo-webhook/server.log &
server_pid=$!
trap 'kill "$server_pid" 2>/dev/null || true' EXIT
url=""
for _ in $(seq 1 100); do
  url=$(python3 -c 'import json,sys
for line in open(sys.argv[1]):
    if "\"listening\"" in line: print(json.loads(line)["url"]); break' build/demo-webhook/server.log 2>/dev/null || true)
  [ -n "$url" ] && break
  kill -0 "$server_pid" 2>/dev/null || { cat build/demo-webhook/server.log; exit 1; }
  sleep 0.1
done
[ -n "$url" ] || { echo "the webhook did not start"; cat build/demo-webhook/server.log; exit 1; }
echo "webhook listening on $url (log: build/demo-webhook/server.log)"
echo
echo "\$ mpigate review examples/trainjobs examples/runtimes examples/mpijobs --server $url --ca .../ca.crt"
status=0
mpigate review examples/trainjobs examples/runtimes examples/mpijobs --server "$url" --ca build/demo-webhook/certs/ca.crt \
  --user maria --group nlp-team-scientists || status=$?
echo "(exit status $status: 1 means some objects were denied, as their '# expect:' headers say;"
echo " legacy-vendor-image's waiver belongs to whoever its '# as:' header names, not to maria)"
[ "$status" -le 1 ] || exit 1
echo "\$ mpigate review examples/trainjobs/legacy-vendor-image.yaml --user omar@acme.example ..."
mpigate review examples/trainjobs/legacy-vendor-image.yaml --server "$url" --ca build/demo-webhook/certs/ca.crt \
  --user omar@acme.example

step "What the webhook counted, then a graceful stop (SIGTERM) and the audit trail it wrote"
python3 - "$url" build/demo-webhook/certs/ca.crt <<'PY'
import ssl, sys, urllib.request
ctx = ssl.create_default_context(cafile=sys.argv[2])
text = urllib.request.urlopen(sys.argv[1] + "/metrics", context=ctx).read().decode()
for line in text.splitlines():
    if line.startswith(("mpigate_admission_requests_total{", "mpigate_config_info")):
        print(line)
PY
kill -TERM "$server_pid"
wait "$server_pid" || true
trap - EXIT
grep -c '"event":"review"' build/demo-webhook/server.log | xargs echo "reviews logged:"
mpigate audit verify build/demo-webhook/audit --public-key build/demo-webhook/audit.pub

step "The pinned-ports profile with real OpenMPI: preflight under mpirun, every TCP port observed"
# --port-base auto: the profile's ranges moved to a window nothing on this machine holds (another
# run's mpirun, a test suite), so that the demo cannot fail with "No sockets were able to be opened".
mpigate preflight --local -np 4 --profile pinned-ports --config . --port-base auto

step "The same job without the pinned environment (what the NetworkPolicy would block)"
if mpigate preflight --local -np 4 --unpinned --config . --port-base auto -o json >build/demo-unpinned.json; then
  echo "unexpected: the unpinned run stayed inside the pinned ranges"; exit 1
fi
python3 -c '
import json
run = json.load(open("build/demo-unpinned.json"))
outside = run["ports"]["violations"]
listeners = sorted({(v["process"], v["family"], v["local"]) for v in outside if v["kind"] == "listener"})
verdict = run["preflight"]["verdict"]
print(f"preflight verdict {verdict}, but {len(outside)} sockets outside the pinned ranges, e.g.:")
for process, family, local in listeners[:6]:
    print(f"  {process:7} {family} LISTEN {local}")
'

step "The NetworkPolicy the controller puts around a PHI job (pinned ports from its data classification)"
echo "\$ mpigate controller --config . --print-netpol examples/trainjobs/phi-pinned.yaml"
mpigate controller --config . --print-netpol examples/trainjobs/phi-pinned.yaml

step "A compliance report from the webhook's audit trail (SOC 2, HIPAA, GDPR, PCI DSS)"
mpigate report --audit build/demo-webhook/audit --public-key build/demo-webhook/audit.pub --config . \
  --format md -o build/report.md
sed -n '1,12p' build/report.md
mpigate report --audit build/demo-webhook/audit --public-key build/demo-webhook/audit.pub --config . \
  -o build/report.html
echo "report: $(pwd)/build/report.html (open it in a browser; it prints, too)"

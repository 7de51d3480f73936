#!/usr/bin/env bash
# `make release VERSION=x.y.z [REGISTRY=host[:port]/path] [PUSH=0] [PLAIN_HTTP=auto|1|0]`: the
# release artifacts of agentrun, in build/release/VERSION/, and their push to an OCI registry.
#
#   agentrun-VERSION.oci.tar           the image (tools/image/build.sh, cached: the base rootfs is not
#                                      rebuilt), as an oci-archive named REGISTRY/agentrun:VERSION
#   agentrun-VERSION.sbom.cdx.json     its SBOM, CycloneDX 1.5, read from the image's layers
#                                      (dpkg status, Python dist-info: tools/release/sbom.py)
#   agentrun-operator-VERSION.tgz      the chart (`helm package`): version and appVersion VERSION, its
#                                      default image REGISTRY/agentrun (tag: the appVersion)
#   release.json                       what was built and pushed: references and digests
#   SHA256SUMS                         sha256 of every file above (`sha256sum -c SHA256SUMS`)
#
# Then (PUSH=1, the default) `skopeo copy` pushes the image to docker://REGISTRY/agentrun:VERSION
# (digest unchanged: --preserve-digests) and `helm push` the chart to oci://REGISTRY
# (oci://REGISTRY/agentrun-operator:VERSION). Credentials: `skopeo login` / `helm registry login`
# beforehand (or REGISTRY_AUTH_FILE). A registry on localhost/127.0.0.1 is spoken to over plain
# HTTP (PLAIN_HTTP=auto), as docker and helm's --plain-http do for a local test registry.
#
# VERSION must be the version in pyproject.toml (the image's `agentrun` package carries it), except
# a pre-release (x.y.z-suffix), which may differ (it is noted). Needs what `make image` needs (root,
# mmdebstrap, buildah), skopeo (apt-get install skopeo) and helm (tools/install-helm.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=${PYTHON:-python3}
VERSION=${VERSION:-}
REGISTRY=${REGISTRY:-ghcr.io/agentrun}
REGISTRY=${REGISTRY%/}
REGISTRY=${REGISTRY#oci://}
PUSH=${PUSH:-1}
PLAIN_HTTP=${PLAIN_HTTP:-auto}
CHART_SRC=helm/agentrun-operator
CHART_NAME=agentrun-operator
START=$(date +%s)
say() { echo "== [release $(( $(date +%s) - START ))s] $*" >&2; }
die() { echo "make release: $*" >&2; exit 1; }

# semantic version 2.0.0 (helm requires one for a chart version)
[[ $VERSION =~ ^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$ ]] \
  || die "VERSION=${VERSION:-<unset>} is not a semantic version x.y.z[-pre]: make release VERSION=0.2.0"
[[ $VERSION != *+* ]] || die "VERSION=$VERSION: build metadata (+...) is not allowed in an image tag"
[[ $REGISTRY =~ ^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*$ ]] \
  || die "REGISTRY=$REGISTRY is not host[:port][/path] (lower case): e.g. ghcr.io/agentrun or localhost:5000/agentrun"
PROJECT_VERSION=$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
if [ "$VERSION" != "$PROJECT_VERSION" ]; then
  [[ $VERSION == *-* ]] || die "VERSION=$VERSION but pyproject.toml says $PROJECT_VERSION: set the project version first (a pre-release x.y.z-suffix may differ)"
  say "note: pre-release $VERSION; the image's agentrun package is $PROJECT_VERSION (pyproject.toml)"
fi
host=${REGISTRY%%/*}
case "$PLAIN_HTTP" in
  auto) case "${host%%:*}" in localhost|127.0.0.1) PLAIN_HTTP=1 ;; *) PLAIN_HTTP=0 ;; esac ;;
  1|0) ;;
  *) die "PLAIN_HTTP=$PLAIN_HTTP: auto, 1 or 0" ;;
esac
command -v skopeo >/dev/null || die "skopeo is not installed: apt-get install skopeo"
HELM=$(bash tools/install-helm.sh | tail -1)

IMAGE=$REGISTRY/agentrun:$VERSION
OUT=$ROOT/build/release/$VERSION
ARCHIVE=$OUT/agentrun-$VERSION.oci.tar
SBOM=$OUT/agentrun-$VERSION.sbom.cdx.json
CHART_TGZ=$OUT/$CHART_NAME-$VERSION.tgz
rm -rf "$OUT"
mkdir -p "$OUT"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# 1. the image: make image's build (cached), renamed to the release reference, digests unchanged
say "image: tools/image/build.sh (cached)"
PYTHON="$PY" bash tools/image/build.sh build
skopeo copy --quiet --preserve-digests "oci-archive:$(bash tools/image/build.sh path)" "oci-archive:$ARCHIVE:$IMAGE"
DIGEST=$(tar -xOf "$ARCHIVE" index.json | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["manifests"][0]["digest"])')
say "image $IMAGE: $DIGEST ($(du -h "$ARCHIVE" | cut -f1))"

# 2. its SBOM, from the archive's layers
"$PY" tools/release/sbom.py "$ARCHIVE" --ref "$IMAGE" -o "$SBOM"

# 3. the chart: version and appVersion VERSION, the default image REGISTRY/agentrun
cp -r "$CHART_SRC" "$work/$CHART_NAME"
"$PY" tools/release/chart.py "$work/$CHART_NAME" --repository "$REGISTRY/agentrun"
"$HELM" package "$work/$CHART_NAME" --version "$VERSION" --app-version "$VERSION" -d "$OUT" >/dev/null
[ -s "$CHART_TGZ" ] || die "helm package wrote no $CHART_TGZ"
"$PY" tools/release/chart.py --check "$CHART_TGZ" --repository "$REGISTRY/agentrun" --version "$VERSION"
say "chart $CHART_TGZ: default image $IMAGE"

# 4. push (the image by digest-preserving copy, the chart as an OCI artifact)
chart_digest=""
if [ "$PUSH" = 1 ]; then
  tls=(); plain=()
  if [ "$PLAIN_HTTP" = 1 ]; then tls=(--dest-tls-verify=false); plain=(--plain-http); fi
  say "push: docker://$IMAGE"
  skopeo copy --quiet --preserve-digests "${tls[@]}" --digestfile "$work/digest" "oci-archive:$ARCHIVE" "docker://$IMAGE"
  [ "$(cat "$work/digest")" = "$DIGEST" ] || die "the registry has $IMAGE as $(cat "$work/digest"), not $DIGEST"
  say "push: oci://$REGISTRY/$CHART_NAME:$VERSION"
  "$HELM" push "$CHART_TGZ" "oci://$REGISTRY" "${plain[@]}" > "$work/helm-push.log" 2>&1 \
    || { cat "$work/helm-push.log" >&2; die "helm push failed"; }
  chart_digest=$(sed -n 's/^Digest: *//p' "$work/helm-push.log" | head -1)
else
  say "PUSH=0: nothing pushed"
fi

# 5. the record and the checksums
"$PY" - "$OUT" "$VERSION" "$IMAGE" "$DIGEST" "$REGISTRY/$CHART_NAME" "$chart_digest" "$PUSH" <<'EOF'
import json, os, sys
out, version, image, digest, chart_ref, chart_digest, push = sys.argv[1:]
doc = {"version": version, "pushed": push == "1",
       "image": {"ref": image, "digest": digest, "archive": f"agentrun-{version}.oci.tar",
                 "sbom": f"agentrun-{version}.sbom.cdx.json"},
       "chart": {"ref": f"oci://{chart_ref}", "version": version, "digest": chart_digest or None,
                 "package": f"agentrun-operator-{version}.tgz"}}
with open(os.path.join(out, "release.json"), "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
EOF
(cd "$OUT" && sha256sum -- *.oci.tar *.sbom.cdx.json *.tgz release.json > SHA256SUMS && sha256sum --quiet -c SHA256SUMS)
say "done: $OUT"
ls -l "$OUT" >&2

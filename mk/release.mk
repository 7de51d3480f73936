# Release artifacts (issue 37): tools/release/release.sh. Included by the top-level Makefile.
#   make release VERSION=x.y.z [REGISTRY=host[:port]/path] [PUSH=0] [PLAIN_HTTP=auto|1|0]
# writes build/release/VERSION/ (the image as an oci-archive, its CycloneDX SBOM, the packaged chart
# whose default image is REGISTRY/agentrun:VERSION, release.json, SHA256SUMS) and pushes the image
# and the chart to REGISTRY (default ghcr.io/agentrun): docs/install.md.
.PHONY: release
release:
	@test -n "$(VERSION)" || { echo "make release: VERSION=x.y.z is required" >&2; exit 2; }
	PYTHON=$(PYTHON) VERSION=$(VERSION) $(if $(REGISTRY),REGISTRY=$(REGISTRY)) $(if $(PUSH),PUSH=$(PUSH)) \
	  $(if $(PLAIN_HTTP),PLAIN_HTTP=$(PLAIN_HTTP)) bash tools/release/release.sh

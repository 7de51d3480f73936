# The agentrun OCI image (issue 15), built without a container engine: see tools/image/build.sh.
#   make image          base rootfs (mmdebstrap, cached in ~/.cache/agentrun/image) + app layer ->
#                       build/image/agentrun.oci.tar, loaded into the runc node's image store
#   make image-lock     re-pin tools/image/requirements.txt from pyproject.toml (then make image)
#   make image-tools    apt-get install mmdebstrap buildah runc (idempotent)
.PHONY: image image-lock image-tools
image:
	bash tools/image/build.sh build

image-lock:
	bash tools/image/build.sh lock

image-tools:
	bash tools/install-image-tools.sh

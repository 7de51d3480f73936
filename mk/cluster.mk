# Local Kubernetes control plane + S3 for tests and `make dev` (issue 3).
# Included by the top-level Makefile (-include mk/*.mk).
#
#   make cluster-up     build localkube if needed, start etcd + kube-apiserver +
#                       kube-controller-manager + the process kubelet under
#                       $(LOCALKUBE_DIR), print the exports to eval
#   make cluster-down   stop all of it (pod processes included)
#   make s3-up/s3-down  moto S3 on 127.0.0.1 with bucket "agentrun"
#   make localkube      just build (cached) and print the binary path
#
# eval "$(make -s cluster-up)" puts KUBECONFIG and the version-matched kubectl
# into the current shell.
PYTHON ?= python3
LOCALKUBE_DIR ?= $(CURDIR)/.localkube
S3_DIR ?= $(LOCALKUBE_DIR)/s3
S3_PORT ?= 0

.PHONY: localkube cluster-up cluster-down cluster-status s3-up s3-down

localkube:
	@e2e/localkube/build.sh

cluster-up:
	@LOCALKUBE_DIR=$(LOCALKUBE_DIR) $(PYTHON) e2e/cluster.py up --dir $(LOCALKUBE_DIR)

cluster-down:
	@LOCALKUBE_DIR=$(LOCALKUBE_DIR) $(PYTHON) e2e/cluster.py down --dir $(LOCALKUBE_DIR)

cluster-status:
	@$(PYTHON) e2e/cluster.py status --dir $(LOCALKUBE_DIR)

s3-up:
	@S3_PORT=$(S3_PORT) $(PYTHON) e2e/cluster.py s3-up --dir $(S3_DIR)

s3-down:
	@$(PYTHON) e2e/cluster.py s3-down --dir $(S3_DIR)

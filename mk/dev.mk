# make dev / dev-down: the whole product on this machine (see tools/dev.sh).
.PHONY: dev dev-down
dev: install
	bash tools/dev.sh

dev-down:
	-@for p in operator tool-server; do f=$${LOCALKUBE_DIR:-.localkube}/$$p.pid; \
	  [ -f $$f ] && kill $$(cat $$f) 2>/dev/null; rm -f $$f; done; true
	-python3 e2e/cluster.py s3-down --dir $${LOCALKUBE_DIR:-.localkube}/s3
	python3 e2e/cluster.py down --dir $${LOCALKUBE_DIR:-.localkube}

# make dev / dev-down: the whole product on this machine (see tools/dev.sh).
.PHONY: dev dev-down
dev: install
	bash tools/dev.sh

# Stops the operator and the tool server (SIGTERM, SIGKILL after 10 s, waiting until they are
# gone), then S3 and the control plane; nothing is left running.
dev-down:
	-@d=$${LOCALKUBE_DIR:-.localkube}; for p in operator tool-server; do f=$$d/$$p.pid; \
	  [ -f $$f ] || continue; pid=$$(cat $$f); \
	  if kill $$pid 2>/dev/null; then \
	    for i in $$(seq 100); do kill -0 $$pid 2>/dev/null || break; sleep 0.1; done; \
	    kill -0 $$pid 2>/dev/null && { echo "$$p (pid $$pid) ignored SIGTERM: SIGKILL"; kill -9 $$pid; }; \
	  fi; rm -f $$f; done; true
	-python3 e2e/cluster.py s3-down --dir $${LOCALKUBE_DIR:-.localkube}/s3
	python3 e2e/cluster.py down --dir $${LOCALKUBE_DIR:-.localkube}

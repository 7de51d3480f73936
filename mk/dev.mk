# make dev / dev-down: the whole product on this machine (see tools/dev.sh).
#   make dev                      control plane + S3 + CRD + operator + tool server + MCP server +
#                                 the invoice example, stopped at its approval, and the MCP agent
#                                 example (examples/mcp-agent.yaml) run to Succeeded; prints what to
#                                 type next
#   DEV_APPROVE=auto make dev     approves it too, waits for Succeeded, prints the trace (CI)
#   LOCALKUBE_DIR=/tmp/x make dev another state dir (default .localkube); ports: DEV_TOOL_PORT,
#                                 DEV_MCP_PORT, DEV_METRICS_PORT, DEV_INBOX_PORT (busy defaults
#                                 fall back to free ports)
#   make dev-down                 stops everything started from that dir
.PHONY: dev dev-down dev-install
dev: dev-install
	bash tools/dev.sh up

dev-down:
	bash tools/dev.sh down

# `make install` unless this checkout is already installed (editable) and `agentrun` is on PATH,
# so a second `make dev` does not re-run pip. After changing dependencies run `make install`.
dev-install:
	@if $(PYTHON) -c 'import sys, pathlib, agentrun; sys.exit(0 if pathlib.Path(agentrun.__file__).resolve().is_relative_to(pathlib.Path("operator").resolve()) else 1)' 2>/dev/null \
	  && command -v agentrun >/dev/null; then echo "agentrun is installed from this checkout (make install to reinstall)"; \
	  else $(MAKE) install; fi

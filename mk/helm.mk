# Helm chart, alerts and dashboard (issue 5). Included by the top-level Makefile.
CHART := helm/agentrun-operator
HELM_BIN = $(shell tools/install-helm.sh)

.PHONY: helm-tools helm-crds helm-alerts helm-lint helm-test helm-check

helm-tools:
	tools/install-helm.sh
	tools/install-promtool.sh

## copy the generated CRD into the chart (Helm installs crds/ but never upgrades them), and the
## admission policies into files/ (rendered by templates/admission-policies.yaml where the API exists)
helm-crds:
	cp crds/agentrun.dev_agentruns.yaml $(CHART)/crds/agentrun.dev_agentruns.yaml
	cp crds/agentrun.dev_agents.yaml $(CHART)/crds/agentrun.dev_agents.yaml
	cp crds/agentrun.dev_admission-policies.yaml crds/agentrun.dev_admission-mutating.yaml $(CHART)/files/
	cp crds/agentrun.dev_agentrunpolicies.yaml $(CHART)/crds/agentrun.dev_agentrunpolicies.yaml
	cp crds/agentrun.dev_agentschedules.yaml $(CHART)/crds/agentrun.dev_agentschedules.yaml
	cp crds/agentrun.dev_tenancy-policy.yaml $(CHART)/files/

## render the chart's alerts with default values into the plain promtool/Prometheus rules file
helm-alerts:
	$(PYTHON) tools/render_alerts.py --helm $(HELM_BIN)

helm-lint:
	$(HELM_BIN) lint --strict $(CHART)
	for f in $(CHART)/ci/*-values.yaml; do $(HELM_BIN) lint --strict $(CHART) -f $$f || exit 1; done

## chart, alert and dashboard tests (unit; e2e ones need the local control plane)
helm-test:
	$(PYTHON) -m pytest -q tests/helm tests/metrics

helm-check: helm-lint helm-test

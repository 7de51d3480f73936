{{/* Name of the chart, overridable. */}}
{{- define "agentrun.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: the release name if it contains the chart name, else release-chart. */}}
{{- define "agentrun.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "agentrun.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "agentrun.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "agentrun.selectorLabels" -}}
app.kubernetes.io/name: {{ include "agentrun.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "agentrun.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "agentrun.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: agentrun
{{- end -}}

{{- define "agentrun.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "agentrun.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "agentrun.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "agentrun.leaseName" -}}
{{- default (include "agentrun.fullname" .) .Values.leaderElection.leaseName -}}
{{- end -}}

{{/* Job label of the operator's scrape target: the metrics Service name (ServiceMonitor default). */}}
{{- define "agentrun.metricsJob" -}}
{{- default (printf "%s-metrics" (include "agentrun.fullname" .)) .Values.prometheusRule.job -}}
{{- end -}}

{{/* Namespaces of lap ServiceAccounts: the release namespace, watchNamespaces, extraNamespaces. */}}
{{- define "agentrun.lapNamespaces" -}}
{{- $ns := list .Release.Namespace -}}
{{- range .Values.watchNamespaces }}{{ $ns = append $ns . }}{{ end -}}
{{- range .Values.lap.serviceAccount.extraNamespaces }}{{ $ns = append $ns . }}{{ end -}}
{{- $ns | uniq | join "," -}}
{{- end -}}

{{/* The alert rules of files/alerts.yaml with their [[placeholders]] replaced by values. */}}
{{- define "agentrun.alertRules" -}}
{{- $rules := .Files.Get "files/alerts.yaml" -}}
{{- $t := merge (dict "job" (include "agentrun.metricsJob" .)) .Values.prometheusRule.thresholds -}}
{{- range $k, $v := $t -}}
{{- $rules = replace (printf "[[%s]]" $k) (toString $v) $rules -}}
{{- end -}}
{{- if contains "[[" $rules -}}
{{- fail (printf "files/alerts.yaml: a [[placeholder]] has no value in prometheusRule.thresholds: %s" (regexFind "\\[\\[[a-zA-Z]*\\]\\]" $rules)) -}}
{{- end -}}
{{- $rules -}}
{{- end -}}

{{/* The selector labels of the pods. */}}
{{- define "metronome.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels every object carries. */}}
{{- define "metronome.labels" -}}
{{ include "metronome.selector" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* Labels of the objects Prometheus and Grafana select: the release label and any extras. */}}
{{- define "metronome.monitoringLabels" -}}
{{ include "metronome.labels" . }}
{{- with .Values.monitoring.release }}
release: {{ . | quote }}
{{- end }}
{{- with .Values.monitoring.extraLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

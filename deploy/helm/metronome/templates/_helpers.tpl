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

{{/* The mode, checked: sidecar, service or all-in-one, with what each one needs. */}}
{{- define "metronome.mode" -}}
{{- $mode := .Values.mode -}}
{{- if not (has $mode (list "sidecar" "service" "all-in-one")) -}}
{{- fail (printf "mode must be sidecar, service or all-in-one, not %q" $mode) -}}
{{- end -}}
{{- if and (eq $mode "sidecar") (or (not .Values.existing.deployment) (not .Values.existing.podLabels)) -}}
{{- fail "mode sidecar needs existing.deployment (your vLLM Deployment) and existing.podLabels (its pods' labels)" -}}
{{- end -}}
{{- if and (eq $mode "service") (not .Values.existing.service) -}}
{{- fail "mode service needs existing.service (your vLLM Service)" -}}
{{- end -}}
{{- $mode -}}
{{- end }}

{{/* The labels of the pods metronome runs in: your vLLM's (sidecar) or the chart's own. */}}
{{- define "metronome.podSelector" -}}
{{- if eq (include "metronome.mode" .) "sidecar" -}}
{{ toYaml .Values.existing.podLabels }}
{{- else -}}
{{ include "metronome.selector" . }}
{{- end -}}
{{- end }}

{{/* Where metronome forwards: vLLM on loopback (sidecar, all-in-one) or your Service. */}}
{{- define "metronome.upstream" -}}
{{- $mode := include "metronome.mode" . -}}
{{- if eq $mode "service" -}}
http://{{ .Values.existing.service }}:{{ .Values.existing.port }}
{{- else if eq $mode "sidecar" -}}
http://127.0.0.1:{{ .Values.existing.port }}
{{- else -}}
http://127.0.0.1:{{ .Values.vllm.port }}
{{- end -}}
{{- end }}

{{/* The name of vLLM's metrics port on the pods, or nothing when it is not scraped here. */}}
{{- define "metronome.vllmPort" -}}
{{- $mode := include "metronome.mode" . -}}
{{- if eq $mode "all-in-one" -}}vllm{{- else if eq $mode "sidecar" -}}{{ .Values.existing.metricsPortName }}{{- end -}}
{{- end }}

{{/* Pod-level settings of the pods the chart creates. */}}
{{- define "metronome.scheduling" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* metronome's container, in every mode; `restartPolicy: Always` makes it a native sidecar. */}}
{{- define "metronome.container" -}}
- name: metronome
  image: "{{ .Values.image.repository }}:{{ .Values.image.tag }}"
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  {{- if ne (include "metronome.mode" .) "service" }}
  restartPolicy: Always
  {{- end }}
  args: ["serve", "--config", "/etc/metronome/metronome.toml", "--admin", "0.0.0.0:{{ .Values.ports.admin }}"]
  {{- with .Values.extraEnv }}
  env:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  ports:
    - name: http
      containerPort: {{ .Values.ports.http }}
      protocol: TCP
    - name: admin
      containerPort: {{ .Values.ports.admin }}
      protocol: TCP
  livenessProbe:
    httpGet:
      path: /healthz
      port: admin
    periodSeconds: 10
    timeoutSeconds: 2
    failureThreshold: 3
  readinessProbe:
    httpGet:
      path: /readyz
      port: admin
    periodSeconds: 5
    timeoutSeconds: 3
    failureThreshold: 2
  resources:
    {{- toYaml .Values.resources | nindent 4 }}
  securityContext:
    runAsNonRoot: true
    runAsUser: 65532
    runAsGroup: 65532
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: ["ALL"]
    seccompProfile:
      type: RuntimeDefault
  volumeMounts:
    - name: metronome-config
      mountPath: /etc/metronome
      readOnly: true
    {{- if .Values.tls.secretName }}
    - name: metronome-tls
      mountPath: /etc/metronome/tls
      readOnly: true
    {{- end }}
{{- end }}

{{/* metronome's volumes: its configuration, and the TLS Secret when set. */}}
{{- define "metronome.volumes" -}}
- name: metronome-config
  configMap:
    name: {{ .Release.Name }}-metronome
{{- if .Values.tls.secretName }}
- name: metronome-tls
  secret:
    secretName: {{ .Values.tls.secretName }}
{{- end }}
{{- end }}

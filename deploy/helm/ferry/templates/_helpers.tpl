{{- define "ferry.name" -}}{{ .Chart.Name }}{{- end -}}

{{- define "ferry.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}{{ .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "ferry.labels" -}}
app.kubernetes.io/name: {{ include "ferry.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "ferry.selector" -}}
app.kubernetes.io/name: {{ include "ferry.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "ferry.image" -}}
{{- if .Values.image.digest -}}{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}{{- end -}}
{{- end -}}

{{/* Policy-scan findings this chart leaves on purpose (checkov), each with its reason. */}}
{{- define "ferry.checkovSkips" -}}
checkov.io/skip1: CKV_K8S_43=Tags by default so that the chart installs as it is; set image.digest (and triton/redis tags to digests) to pin
checkov.io/skip2: CKV_K8S_15=IfNotPresent by default (pullPolicy is a value); with immutable tags or digests Always only adds registry load
{{- end -}}

{{- define "ferry.redisHost" -}}{{ include "ferry.fullname" . }}-redis{{- end -}}

{{- define "ferry.redisUrl" -}}
{{- if and .Values.redis.builtin .Values.redis.cluster -}}
{{- fail "redis.cluster needs an external Redis Cluster (redis.builtin=false, redis.externalUrl)" -}}
{{- end -}}
{{- if .Values.redis.builtin -}}redis://{{ include "ferry.redisHost" . }}:6379/0
{{- else -}}{{ required "redis.externalUrl is required when redis.builtin is false" .Values.redis.externalUrl }}{{- end -}}
{{- end -}}

{{- define "ferry.redisSecret" -}}
{{- .Values.redis.existingPasswordSecret | default (printf "%s-redis" (include "ferry.fullname" .)) -}}
{{- end -}}

{{- define "ferry.tritonUrl" -}}
{{- if .Values.triton.enabled -}}{{ include "ferry.fullname" . }}-triton:8001
{{- else -}}{{ required "triton.externalUrl is required when triton.enabled is false" .Values.triton.externalUrl }}{{- end -}}
{{- end -}}

{{- /* Triton's HTTP address for the batcher's infer calls; empty: over gRPC */ -}}
{{- define "ferry.tritonHttpUrl" -}}
{{- if .Values.batcher.inferOverHttp -}}
{{- if .Values.triton.enabled -}}{{ include "ferry.fullname" . }}-triton:8000
{{- else -}}{{ .Values.triton.externalHttpUrl }}{{- end -}}
{{- end -}}
{{- end -}}

{{- define "ferry.authSecret" -}}
{{- .Values.auth.existingSecret | default (printf "%s-auth" (include "ferry.fullname" .)) -}}
{{- end -}}

{{/* Security context of every Ferry and Redis container. */}}
{{- define "ferry.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "ferry.podSecurity" -}}
runAsNonRoot: true
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The FERRY_* variables gateway and batchers share. */}}
{{- define "ferry.commonEnv" -}}
- name: FERRY_REDIS_URL
  value: {{ include "ferry.redisUrl" . | quote }}
{{- if include "ferry.redisHasPassword" . }}
- name: FERRY_REDIS_PASSWORD_FILE
  value: /var/run/secrets/ferry/redis/password
{{- end }}
{{- if .Values.redis.cluster }}
- name: FERRY_REDIS_CLUSTER
  value: "true"
{{- end }}
- name: FERRY_TRITON_URL
  value: {{ include "ferry.tritonUrl" . | quote }}
- name: FERRY_PARTITIONS
  value: {{ .Values.partitions | quote }}
{{- if .Values.rollouts.models }}
- name: FERRY_ROLLOUTS
  value: {{ .Values.rollouts.models | toJson | quote }}
{{- end }}
- name: FERRY_LOG_LEVEL
  value: INFO
{{- if .Values.tracing.otlpEndpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .Values.tracing.otlpEndpoint | quote }}
- name: OTEL_TRACES_SAMPLER
  value: parentbased_traceidratio
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ .Values.tracing.samplingRatio | quote }}
{{- end }}
{{- range $name, $value := .Values.extraEnv }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- end -}}

{{- define "ferry.redisHasPassword" -}}
{{- if or .Values.redis.builtin .Values.redis.existingPasswordSecret -}}true{{- end -}}
{{- end -}}

{{- define "ferry.redisPasswordVolume" -}}
- name: redis-password
  secret:
    secretName: {{ include "ferry.redisSecret" . }}
    defaultMode: 0400
{{- end -}}

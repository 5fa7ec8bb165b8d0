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

{{- define "ferry.redisImage" -}}
{{- $i := .Values.redis.image -}}
{{- if $i.digest -}}{{ $i.repository }}@{{ $i.digest }}{{- else -}}{{ $i.repository }}:{{ $i.tag }}{{- end -}}
{{- end -}}

{{- /* The pod security context of every Redis pod, single, node or sentinel. */ -}}
{{- define "ferry.redisPodSecurity" -}}
runAsNonRoot: true
runAsUser: 10001  # redis-server is started directly: no entrypoint needs its user
runAsGroup: 10001
fsGroup: 10001  # the data volume is the group's
seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{- /* A Redis node's volume (AOF and RDB), as a StatefulSet's volumeClaimTemplates item. */ -}}
{{- define "ferry.redisDataClaim" -}}
- metadata:
    name: data
  spec:
    accessModes: ["ReadWriteOnce"]
    {{- if .Values.redis.storageClassName }}
    storageClassName: {{ .Values.redis.storageClassName }}
    {{- end }}
    resources:
      requests:
        storage: {{ .Values.redis.storage }}
{{- end -}}

{{- /* With sentinels, the URL gives only the database, credentials and TLS: its host is ignored. */ -}}
{{- define "ferry.redisUrl" -}}
{{- include "ferry.redisCheck" . -}}
{{- if and .Values.redis.builtin .Values.redis.sentinel.enabled -}}redis://{{ include "ferry.redisHost" . }}-headless:6379/0
{{- else if .Values.redis.builtin -}}redis://{{ include "ferry.redisHost" . }}:6379/0
{{- else -}}{{ required "redis.externalUrl is required when redis.builtin is false" .Values.redis.externalUrl }}{{- end -}}
{{- end -}}

{{- /* The Redis values that cannot go together, each refused with its reason. */ -}}
{{- define "ferry.redisCheck" -}}
{{- $r := .Values.redis -}}
{{- $s := $r.sentinel -}}
{{- if and $r.builtin $r.cluster -}}
{{- fail "redis.cluster needs an external Redis Cluster (redis.builtin=false, redis.externalUrl)" -}}
{{- end -}}
{{- if and $s.enabled $r.cluster -}}
{{- fail "redis.sentinel and redis.cluster exclude each other: a Redis Cluster fails over by itself" -}}
{{- end -}}
{{- if and $r.builtin (or $s.externalAddresses $s.existingPasswordSecret) -}}
{{- fail "redis.sentinel.externalAddresses and .existingPasswordSecret name sentinels outside the chart: they need redis.builtin=false (the built-in group has its own, with Redis's password)" -}}
{{- end -}}
{{- if and $s.enabled (not $r.builtin) (not $s.externalAddresses) -}}
{{- fail "redis.sentinel.externalAddresses (host:port of each sentinel) is required for an external Redis with redis.sentinel.enabled" -}}
{{- end -}}
{{- if and $r.builtin (not (kindIs "invalid" $r.minReplicas)) -}}
{{- $replicas := ternary (int $s.replicas) 0 $s.enabled -}}
{{- if gt (int $r.minReplicas) $replicas -}}
{{- fail (printf "redis.minReplicas (%d) exceeds the built-in Redis's replicas (%d): no admission could be confirmed (redis.sentinel.enabled and .replicas add them)" (int $r.minReplicas) $replicas) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* FERRY_REDIS_SENTINELS: the chart's sentinels by their pods' names, or the external ones. */ -}}
{{- define "ferry.redisSentinels" -}}
{{- $s := .Values.redis.sentinel -}}
{{- if and $s.enabled .Values.redis.builtin -}}
{{- $name := printf "%s-sentinel" (include "ferry.redisHost" .) -}}
{{- $addresses := list -}}
{{- range $i := until (int $s.sentinels) -}}
{{- $addresses = append $addresses (printf "%s-%d.%s.%s.svc:26379" $name $i $name $.Release.Namespace) -}}
{{- end -}}
{{- join "," $addresses -}}
{{- else if $s.enabled -}}{{ join "," $s.externalAddresses }}
{{- end -}}
{{- end -}}

{{- /* The chart's Redis nodes, host:port, the first the first master. */ -}}
{{- define "ferry.redisNodes" -}}
{{- $host := include "ferry.redisHost" . -}}
{{- $nodes := list -}}
{{- range $i := until (add1 (int .Values.redis.sentinel.replicas) | int) -}}
{{- $nodes = append $nodes (printf "%s-%d.%s-headless.%s.svc:6379" $host $i $host $.Release.Namespace) -}}
{{- end -}}
{{- join "," $nodes -}}
{{- end -}}

{{- /* The Secret with the sentinels' password: Redis's for the built-in ones; empty: none. */ -}}
{{- define "ferry.redisSentinelSecret" -}}
{{- if .Values.redis.sentinel.enabled -}}
{{- if .Values.redis.builtin -}}{{ include "ferry.redisSecret" . }}
{{- else -}}{{ .Values.redis.sentinel.existingPasswordSecret }}{{- end -}}
{{- end -}}
{{- end -}}

{{- /* ... where it is not Redis's own, already mounted: a volume of its own in Ferry's pods. */ -}}
{{- define "ferry.externalSentinelSecret" -}}
{{- if not .Values.redis.builtin -}}{{ include "ferry.redisSentinelSecret" . }}{{- end -}}
{{- end -}}

{{- /* A KEDA Redis Streams trigger's type and where it finds Redis (autoscaling.keda.redisAddress:
the nodes of a Redis Cluster, the sentinels with redis.sentinel, else the server). */ -}}
{{- define "ferry.kedaRedisTrigger" -}}
{{- $k := .Values.autoscaling.keda -}}
{{- if .Values.redis.cluster -}}
- type: redis-cluster-streams
  metadata:
    addresses: {{ $k.redisAddress | quote }}
{{- else if .Values.redis.sentinel.enabled -}}
- type: redis-sentinel-streams
  metadata:
    addresses: {{ $k.redisAddress | default (include "ferry.redisSentinels" .) | quote }}
    sentinelMaster: {{ .Values.redis.sentinel.masterName | quote }}
{{- else -}}
- type: redis-streams
  metadata:
    address: {{ $k.redisAddress | default (printf "%s:6379" (include "ferry.redisHost" .)) | quote }}
{{- end -}}
{{- end -}}

{{- /* What scripts/redis-sentinel.sh needs to know, in nodes and sentinels alike. */ -}}
{{- define "ferry.redisSentinelEnv" -}}
- name: POD_NAME
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
- {name: NODES, value: {{ include "ferry.redisNodes" . | quote }}}
- {name: SENTINELS, value: {{ include "ferry.redisSentinels" . | quote }}}
- {name: MASTER_NAME, value: {{ .Values.redis.sentinel.masterName | quote }}}
- {name: PASSWORD_FILE, value: /var/run/secrets/ferry/redis/password}
{{- end -}}

{{- /* The Redis nodes and sentinels, as NetworkPolicy peers: they reach each other. */ -}}
{{- define "ferry.redisGroupPeers" -}}
- podSelector:
    matchLabels:
      {{- include "ferry.selector" (dict "root" . "component" "redis") | nindent 6 }}
- podSelector:
    matchLabels:
      {{- include "ferry.selector" (dict "root" . "component" "redis-sentinel") | nindent 6 }}
{{- end -}}

{{- /* Pods of one component on different nodes where the scheduler can: a node lost takes one. */ -}}
{{- define "ferry.spreadRedis" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "ferry.selector" . | nindent 12 }}
{{- end -}}

{{- /* FERRY_REDIS_MIN_REPLICAS: redis.minReplicas, else 1 with sentinels; empty: not set (0). */ -}}
{{- define "ferry.redisMinReplicas" -}}
{{- $r := .Values.redis -}}
{{- if not (kindIs "invalid" $r.minReplicas) -}}{{ int $r.minReplicas }}
{{- else if $r.sentinel.enabled -}}1
{{- end -}}
{{- end -}}

{{- define "ferry.redisSecret" -}}
{{- .Values.redis.existingPasswordSecret | default (printf "%s-redis" (include "ferry.fullname" .)) -}}
{{- end -}}

{{- /* Triton's gRPC address for the gateways: the chart's Service (one virtual address), or the
external one. */ -}}
{{- define "ferry.tritonUrl" -}}
{{- if .Values.triton.enabled -}}{{ include "ferry.fullname" . }}-triton:8001
{{- else -}}{{ include "ferry.externalTritonUrl" . }}{{- end -}}
{{- end -}}

{{- /* ... for the batchers: the headless Service, a name that resolves to every ready Triton pod
(each pod an endpoint with its own instances), or the external one(s). */ -}}
{{- define "ferry.batcherTritonUrl" -}}
{{- if .Values.triton.enabled -}}{{ include "ferry.fullname" . }}-triton-headless:8001
{{- else -}}{{ include "ferry.externalTritonUrl" . }}{{- end -}}
{{- end -}}

{{- define "ferry.externalTritonUrl" -}}
{{- required "triton.externalUrl is required when triton.enabled is false" .Values.triton.externalUrl -}}
{{- end -}}

{{- /* Triton's HTTP address for the batcher's infer calls, the same pods as its gRPC address;
empty: over gRPC */ -}}
{{- define "ferry.tritonHttpUrl" -}}
{{- if .Values.batcher.inferOverHttp -}}
{{- if .Values.triton.enabled -}}{{ include "ferry.fullname" . }}-triton-headless:8000
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

{{/* The FERRY_* variables gateway and batchers share (not Triton's address: each has its own). */}}
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
{{- if .Values.redis.sentinel.enabled }}
- name: FERRY_REDIS_SENTINELS
  value: {{ include "ferry.redisSentinels" . | quote }}
- name: FERRY_REDIS_SENTINEL_MASTER
  value: {{ .Values.redis.sentinel.masterName | quote }}
{{- if .Values.redis.builtin }}
- name: FERRY_REDIS_SENTINEL_PASSWORD_FILE
  value: /var/run/secrets/ferry/redis/password
{{- else if include "ferry.externalSentinelSecret" . }}
- name: FERRY_REDIS_SENTINEL_PASSWORD_FILE
  value: /var/run/secrets/ferry/redis-sentinel/password
{{- end }}
{{- end }}
{{- with include "ferry.redisMinReplicas" . }}
- name: FERRY_REDIS_MIN_REPLICAS
  value: {{ . | quote }}
- name: FERRY_REDIS_WAIT_MS
  value: {{ $.Values.redis.waitMs | quote }}
{{- end }}
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

{{/* fairness.weights as FERRY_CLIENT_WEIGHTS: client=weight, comma-separated, sorted */}}
{{- define "ferry.clientWeights" -}}
{{- $pairs := list -}}
{{- range $client, $weight := .Values.fairness.weights -}}
{{- $pairs = append $pairs (printf "%s=%v" $client $weight) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}

{{/* inferenceLog.models as FERRY_LOG_MODELS: model=rate, comma-separated, sorted */}}
{{- define "ferry.logModels" -}}
{{- $pairs := list -}}
{{- range $model, $rate := .Values.inferenceLog.models -}}
{{- $pairs = append $pairs (printf "%s=%v" $model $rate) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}

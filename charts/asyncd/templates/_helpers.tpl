{{/* Chart name, truncated to a DNS label. */}}
{{- define "asyncd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Prefix of resource names: "<release>-asyncd", or just the release name when it already
contains the chart name. Kept at 50 characters so suffixes like "-scheduler-metrics"
still fit a 63-character name.
*/}}
{{- define "asyncd.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "asyncd.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels of every resource. `app.kubernetes.io/part-of: asyncd` is what the ServiceMonitor
and the dispatcher metrics Service select on; the operator puts it (with
`app.kubernetes.io/component: dispatcher`) on the dispatcher pods it creates.
*/}}
{{- define "asyncd.labels" -}}
helm.sh/chart: {{ include "asyncd.chart" . }}
app.kubernetes.io/name: {{ include "asyncd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: asyncd
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component: include "asyncd.selectorLabels" (list . "api") */}}
{{- define "asyncd.selectorLabels" -}}
{{- $ctx := index . 0 -}}
app.kubernetes.io/name: {{ include "asyncd.name" $ctx }}
app.kubernetes.io/instance: {{ $ctx.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/* All labels of one component: include "asyncd.componentLabels" (list . "api") */}}
{{- define "asyncd.componentLabels" -}}
{{ include "asyncd.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/* The asyncd image reference. */}}
{{- define "asyncd.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/* The operator image reference. */}}
{{- define "asyncd.operatorImage" -}}
{{- $img := .Values.operator.image -}}
{{- if $img.digest -}}
{{ $img.repository }}@{{ $img.digest }}
{{- else -}}
{{ $img.repository }}:{{ $img.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/* ServiceAccount of the api and scheduler. */}}
{{- define "asyncd.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "asyncd.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* ServiceAccount of the operator. */}}
{{- define "asyncd.operatorServiceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (printf "%s-operator" (include "asyncd.fullname" .)) .Values.operator.serviceAccount.name }}
{{- else }}
{{- required "operator.serviceAccount.name is required when operator.serviceAccount.create is false" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* ServiceAccount of the dispatchers. */}}
{{- define "asyncd.dispatcherServiceAccountName" -}}
{{- required "dispatcher.serviceAccount.name is required" .Values.dispatcher.serviceAccount.name }}
{{- end }}

{{/* Secret holding the store URL (the user's: the chart ships no credentials), and its key. */}}
{{- define "asyncd.storeSecretName" -}}
{{- required "store.existingSecret is required: create a Secret holding the store URL (kubectl create secret generic asyncd-store --from-literal=url=postgres://…) and name it; the chart ships no default credentials" .Values.store.existingSecret }}
{{- end }}

{{- define "asyncd.storeSecretKey" -}}
{{- required "store.existingSecretKey is required" .Values.store.existingSecretKey }}
{{- end }}

{{/* Fail early, with the message that says what to do, when no store Secret is named. */}}
{{- define "asyncd.validateStore" -}}
{{- $_ := include "asyncd.storeSecretName" . }}
{{- if hasKey .Values.store "url" }}
{{- fail "store.url is no longer supported: the chart ships no credentials; put the URL into a Secret and name it with store.existingSecret" }}
{{- end }}
{{- end }}

{{/* "<namespace>/<routing ConfigMap>" */}}
{{- define "asyncd.routingRef" -}}
{{ .Release.Namespace }}/{{ .Values.routing.configMapName }}
{{- end }}

{{/* Environment shared by the api and the scheduler: include "asyncd.env" (list . port) */}}
{{- define "asyncd.env" -}}
{{- $ := index . 0 -}}
- name: ASYNCD_STORE
  valueFrom:
    secretKeyRef:
      name: {{ include "asyncd.storeSecretName" $ }}
      key: {{ include "asyncd.storeSecretKey" $ }}
{{- with $.Values.store.timeout }}
- name: ASYNCD_STORE_TIMEOUT
  value: {{ . | quote }}
{{- end }}
- name: ASYNCD_LISTEN
  value: "0.0.0.0:{{ index . 1 }}"
{{- /* One source of job configs: asyncd refuses both at once. */}}
{{- if $.Values.routing.mountAsFolder }}
- name: ASYNCD_CONFIG
  value: {{ $.Values.routing.mountPath | quote }}
{{- else }}
- name: ASYNCD_ROUTING_CONFIGMAP
  value: {{ include "asyncd.routingRef" $ | quote }}
{{- end }}
{{- with $.Values.kafka.brokers }}
- name: ASYNCD_KAFKA_BROKERS
  value: {{ . | quote }}
{{- end }}
- name: ASYNCD_KAFKA_THRESHOLD
  value: {{ $.Values.kafka.threshold | quote }}
- name: ASYNCD_LOG
  value: {{ $.Values.logLevel | quote }}
- name: ASYNCD_LOG_FORMAT
  value: {{ $.Values.logFormat | quote }}
- name: ASYNCD_INSTANCE
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- end }}

{{/* Kafka TLS/SASL settings (ASYNCD_KAFKA_* keys of kafka.securitySecret) as variables. */}}
{{- define "asyncd.kafkaEnvFrom" -}}
{{- with .Values.kafka.securitySecret }}
envFrom:
  - secretRef:
      name: {{ . }}
      optional: false
{{- end }}
{{- end }}

{{/* Volumes and mounts of the routing folder. */}}
{{- define "asyncd.routingVolume" -}}
{{- if .Values.routing.mountAsFolder -}}
- name: routing
  configMap:
    name: {{ .Values.routing.configMapName }}
    optional: true
{{- end }}
{{- end }}

{{- define "asyncd.routingVolumeMount" -}}
{{- if .Values.routing.mountAsFolder -}}
- name: routing
  mountPath: {{ .Values.routing.mountPath }}
  readOnly: true
{{- end }}
{{- end }}

{{/*
Health probes of an asyncd container listening on the port named http:
include "asyncd.probes" "HTTP" (or "HTTPS" when the listener serves TLS: the kubelet
does not verify the certificate).
*/}}
{{- define "asyncd.probes" -}}
startupProbe:
  httpGet: {path: /healthz, port: http, scheme: {{ . }}}
  periodSeconds: 2
  failureThreshold: 30
livenessProbe:
  httpGet: {path: /healthz, port: http, scheme: {{ . }}}
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 3
readinessProbe:
  httpGet: {path: /readyz, port: http, scheme: {{ . }}}
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 2
{{- end }}

{{/* Settings the operator cannot work with. */}}
{{- define "asyncd.validateOperator" -}}
{{- if not (has .Values.operator.scope (list "namespace" "cluster")) }}
{{- fail (printf "operator.scope must be \"namespace\" or \"cluster\", got %q" .Values.operator.scope) }}
{{- end }}
{{- if ne .Values.store.existingSecretKey "url" }}
{{- fail (printf "the operator reads the store URL from the key \"url\" of the store Secret; store.existingSecretKey is %q" .Values.store.existingSecretKey) }}
{{- end }}
{{- if and (gt (int .Values.operator.replicas) 1) (not .Values.operator.leaderElection.enabled) }}
{{- fail "operator.replicas above 1 needs operator.leaderElection.enabled: without it every replica reconciles" }}
{{- end }}
{{- end }}

{{/*
operator.executorAddresses.<key> as a JSON array, each entry shaped like a CIDR. The
operator parses them for real at start; this catches a value that is no list, or a
bare address, at install time instead of in a crash-looping pod.
*/}}
{{- define "asyncd.cidrs" -}}
{{- $root := index . 0 }}{{- $key := index . 1 }}
{{- $value := index $root.Values.operator.executorAddresses $key | default list }}
{{- if not (kindIs "slice" $value) }}
{{- fail (printf "operator.executorAddresses.%s must be a list of CIDRs, e.g. [10.0.0.0/16], got %v" $key $value) }}
{{- end }}
{{- range $value }}
{{- if not (regexMatch "^[0-9A-Fa-f.:]+/[0-9]{1,3}$" (toString .)) }}
{{- fail (printf "operator.executorAddresses.%s: %q is not a CIDR (an address and a prefix length: 10.0.0.0/8, fd00::/8)" $key (toString .)) }}
{{- end }}
{{- end }}
{{- toJson $value }}
{{- end }}

{{/* Name of the operator's leader-election Lease. */}}
{{- define "asyncd.operatorLease" -}}
{{- printf "%s-operator" (include "asyncd.fullname" .) }}
{{- end }}

{{/* Whether the operator reads the limiters' usage from the api (operator.limiterUsage). */}}
{{- define "asyncd.operatorReadsUsage" -}}
{{- if and .Values.operator.limiterUsage.enabled (eq .Values.api.auth.mode "kubernetes") (not .Values.api.tls.secretName) -}}
true
{{- end -}}
{{- end }}

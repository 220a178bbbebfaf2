{{/*
Chart name, truncated to the 63 characters of a DNS label.
*/}}
{{- define "geoingest.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: <release>-<chart>, or the release alone when it already holds the chart name.
Kept to 56 characters: the driver's Service is <full name>-driver, a DNS label of at most 63.
*/}}
{{- define "geoingest.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 56 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 56 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 56 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "geoingest.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels of every object.
*/}}
{{- define "geoingest.labels" -}}
helm.sh/chart: {{ include "geoingest.chart" . }}
{{ include "geoingest.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: geoingest
{{- end }}

{{/*
Selector labels of the ingest pod (in kubernetes mode: the Spark driver). Executor pods carry
another component, so no selector of the chart ever picks them.
*/}}
{{- define "geoingest.selectorLabels" -}}
app.kubernetes.io/name: {{ include "geoingest.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: ingest
{{- end }}

{{- define "geoingest.executorLabels" -}}
app.kubernetes.io/name: {{ include "geoingest.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: spark-executor
app.kubernetes.io/part-of: geoingest
{{- end }}

{{- define "geoingest.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "geoingest.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "geoingest.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{- define "geoingest.kubernetesMode" -}}
{{- if eq .Values.spark.mode "kubernetes" }}true{{ end }}
{{- end }}

{{/* Name of the driver's headless Service (spark.driver.host) */}}
{{- define "geoingest.driverServiceName" -}}
{{- printf "%s-driver" (include "geoingest.fullname" .) }}
{{- end }}

{{- define "geoingest.executorTemplateName" -}}
{{- printf "%s-executor-template" (include "geoingest.fullname" .) }}
{{- end }}

{{- define "geoingest.checkpointLocation" -}}
{{- .Values.checkpoint.uri | default "/data/checkpoints" }}
{{- end }}

{{- define "geoingest.sparkMaster" -}}
{{- if include "geoingest.kubernetesMode" . }}
{{- printf "k8s://%s" .Values.spark.kubernetes.apiServer }}
{{- else }}
{{- .Values.spark.localMaster }}
{{- end }}
{{- end }}

{{/*
Paths inside the pod.
*/}}
{{- define "geoingest.configDir" -}}/etc/geoingest{{- end }}
{{- define "geoingest.sparkAuthDir" -}}/etc/geoingest-spark-auth{{- end }}

{{/*
The Secret volume of Spark's RPC secret (kubernetes mode, rpcSecurity.secret.name set), and its mount.
*/}}
{{- define "geoingest.sparkAuthVolume" -}}
{{- $r := .Values.spark.kubernetes.rpcSecurity }}
{{- if and (include "geoingest.kubernetesMode" .) $r.authenticate $r.secret.name }}
- name: spark-auth
  secret:
    secretName: {{ $r.secret.name }}
    items:
      - key: {{ $r.secret.key }}
        path: {{ $r.secret.key }}
{{- end }}
{{- end }}
{{- define "geoingest.sparkAuthVolumeMount" -}}
{{- $r := .Values.spark.kubernetes.rpcSecurity }}
{{- if and (include "geoingest.kubernetesMode" .) $r.authenticate $r.secret.name }}
- name: spark-auth
  mountPath: {{ include "geoingest.sparkAuthDir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{/*
Spark configuration the chart sets, as JSON: in kubernetes mode what makes the pod a client-mode
driver, then config.spark and spark.kubernetes.conf over it.
*/}}
{{- define "geoingest.sparkConf" -}}
{{- $conf := dict }}
{{- if include "geoingest.kubernetesMode" . }}
{{- $k := .Values.spark.kubernetes }}
{{- $e := $k.executor }}
{{- $_ := set $conf "spark.kubernetes.namespace" .Release.Namespace }}
{{- $_ := set $conf "spark.kubernetes.container.image" (include "geoingest.image" .) }}
{{- $_ := set $conf "spark.kubernetes.container.image.pullPolicy" .Values.image.pullPolicy }}
{{- with .Values.imagePullSecrets }}
{{- $names := list }}
{{- range . }}{{ $names = append $names .name }}{{ end }}
{{- $_ := set $conf "spark.kubernetes.container.image.pullSecrets" (join "," $names) }}
{{- end }}
{{- $_ := set $conf "spark.driver.host" (printf "%s.%s.svc" (include "geoingest.driverServiceName" .) .Release.Namespace) }}
{{- $_ := set $conf "spark.driver.bindAddress" "0.0.0.0" }}
{{- $_ := set $conf "spark.driver.port" (toString $k.driverPort) }}
{{- $_ := set $conf "spark.blockManager.port" (toString $k.blockManagerPort) }}
{{- $_ := set $conf "spark.executor.instances" (toString $e.instances) }}
{{- $_ := set $conf "spark.executor.cores" (toString $e.cores) }}
{{- $_ := set $conf "spark.executor.memory" $e.memory }}
{{- $_ := set $conf "spark.executor.memoryOverhead" $e.memoryOverhead }}
{{- $_ := set $conf "spark.kubernetes.executor.request.cores" (toString ($e.requestCores | default $e.cores)) }}
{{- with $e.limitCores }}
{{- $_ := set $conf "spark.kubernetes.executor.limit.cores" (toString .) }}
{{- end }}
{{- $_ := set $conf "spark.kubernetes.executor.podTemplateFile" (printf "%s/executor-pod-template.yaml" (include "geoingest.configDir" .)) }}
{{- $_ := set $conf "spark.kubernetes.executor.podTemplateContainerName" "executor" }}
{{- /* Spark allows 47 characters: executor pods are <prefix>-exec-<n> */}}
{{- $_ := set $conf "spark.kubernetes.executor.podNamePrefix" (include "geoingest.fullname" . | trunc 47 | trimSuffix "-") }}
{{- /* app/spark.py sizes shuffles by the driver's cores; the executors' task slots are what count */}}
{{- $_ := set $conf "spark.sql.shuffle.partitions" (toString (mul $e.instances $e.cores)) }}
{{- with $k.rpcSecurity }}
{{- if .authenticate }}
{{- $_ := set $conf "spark.authenticate" "true" }}
{{- if .secret.name }}
{{- $file := printf "%s/%s" (include "geoingest.sparkAuthDir" $) .secret.key }}
{{- $_ := set $conf "spark.authenticate.secret.driver.file" $file }}
{{- $_ := set $conf "spark.authenticate.secret.executor.file" $file }}
{{- end }}
{{- if .encrypt }}
{{- $_ := set $conf "spark.network.crypto.enabled" "true" }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- $conf = mergeOverwrite $conf (deepCopy (.Values.config.spark | default dict)) }}
{{- if include "geoingest.kubernetesMode" . }}
{{- $conf = mergeOverwrite $conf (deepCopy (.Values.spark.kubernetes.conf | default dict)) }}
{{- end }}
{{- toJson $conf }}
{{- end }}

{{/*
Refuses values that would not work: settings the chart owns, secrets bound for the ConfigMap
(keys with the words app/settings.py masks, URIs with a password), a catalog name pyiceberg's
environment variables cannot spell, a local warehouse that Spark executors cannot reach.
*/}}
{{- define "geoingest.validate" -}}
{{- $managed := list "checkpoint_location" "metrics_port" "spark_master" "cache_dir" }}
{{- range $key := $managed }}
{{- if hasKey $.Values.config $key }}
{{- fail (printf "config.%s is set by the chart: use checkpoint.uri, metrics.port or spark.mode instead" $key) }}
{{- end }}
{{- end }}
{{- $markers := list "password" "secret" "token" "jaas" "credential" "ssl.keystore.key" "key.pem" }}
{{- range $section := list "catalog" "kafka" "spark" }}
{{- range $key, $value := (get $.Values.config $section | default dict) }}
{{- range $marker := $markers }}
{{- if contains $marker (lower $key) }}
{{- fail (printf "config.%s.%s looks like a secret: put it in an existing Secret and use `secrets` or `extraEnv`" $section $key) }}
{{- end }}
{{- end }}
{{- if regexMatch "^[a-zA-Z][a-zA-Z0-9+.-]*://[^/@]*:[^/@]*@" (toString $value) }}
{{- fail (printf "config.%s.%s holds a URI with a password: put the URI in an existing Secret (secrets.catalog.uriKey)" $section $key) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and .Values.secrets.objectStore.existingSecret (not (regexMatch "^[a-zA-Z0-9]+$" (toString .Values.config.catalog_name))) }}
{{- fail "config.catalog_name: letters and digits only when secrets.objectStore is used (pyiceberg reads PYICEBERG_CATALOG__<NAME>__S3__...)" }}
{{- end }}
{{- if and (include "geoingest.kubernetesMode" .) (hasPrefix "file:" (toString (get (.Values.config.catalog | default dict) "warehouse"))) }}
{{- fail "spark.mode kubernetes: config.catalog.warehouse is a local path, which executors (other pods) cannot write; use an object store" }}
{{- end }}
{{- end }}

{{/*
Why a pod other than the ingest pod cannot reach the table, or nothing: a SQLite catalog is a file
on the ingest pod's volume unless a Secret replaces its URI, and a file: warehouse is a path there.
*/}}
{{- define "geoingest.tableUnreachableFromOtherPods" -}}
{{- $catalog := .Values.config.catalog | default dict }}
{{- $secret := .Values.secrets.catalog }}
{{- if and (hasPrefix "sqlite" (toString (get $catalog "uri"))) (not (and $secret.existingSecret $secret.uriKey)) }}
{{- print "the SQLite catalog lives on the ingest pod's volume, which the job's pod cannot share; use a PostgreSQL or REST catalog, or config.maintenance_mode (beside, between-batches, background) to maintain from the ingest pod" }}
{{- else if hasPrefix "file:" (toString (get $catalog "warehouse")) }}
{{- print "config.catalog.warehouse is a local path, which the job's pod cannot reach; use an object store, or config.maintenance_mode to maintain from the ingest pod" }}
{{- end }}
{{- end }}

{{/*
"true" when the maintenance CronJob is rendered. auto: only in kubernetes mode, whose table is on
shared storage anyway (executors write it), so a job keeps it maintained on schedule even while
ingest is paused or restarting; in local mode the service's own maintenance covers its one pod,
whose table is usually on that pod's volume, out of a job's reach. An explicit true fails rather
than render a job that can only fail.
*/}}
{{- define "geoingest.maintenanceCronJob" -}}
{{- $enabled := .Values.maintenance.cronJob.enabled }}
{{- $unreachable := include "geoingest.tableUnreachableFromOtherPods" . }}
{{- if kindIs "bool" $enabled }}
{{- if and $enabled $unreachable }}
{{- fail (printf "maintenance.cronJob: %s" $unreachable) }}
{{- else if $enabled }}true
{{- end }}
{{- else if and (include "geoingest.kubernetesMode" .) (not $unreachable) }}true
{{- end }}
{{- end }}

{{/*
settings.toml: scalars first, then one table per map (catalog, kafka, spark). Every value is
written with toJson, whose strings are valid TOML basic strings; map values are strings, as the
service reads them.
*/}}
{{- define "geoingest.settingsToml" -}}
# geoingest settings (app/settings.py), rendered by the chart from `config`.
# checkpoint_location, metrics_port and spark_master come from the environment (the chart sets
# them), secrets too (from existing Secrets).
{{- $cfg := deepCopy .Values.config }}
{{- $_ := set $cfg "spark" (include "geoingest.sparkConf" . | fromJson) }}
{{- range $key := keys $cfg | sortAlpha }}
{{- $value := get $cfg $key }}
{{- if not (or (kindIs "map" $value) (kindIs "invalid" $value)) }}
{{ $key }} = {{ toJson $value }}
{{- end }}
{{- end }}
{{- range $key := keys $cfg | sortAlpha }}
{{- $value := get $cfg $key }}
{{- if and (kindIs "map" $value) (not (empty $value)) }}

[{{ $key }}]
{{- range $sub := keys $value | sortAlpha }}
{{- $v := get $value $sub }}
{{- if not (kindIs "invalid" $v) }}
{{ toJson $sub }} = {{ toJson (toString $v) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- range $i, $route := .Values.routes }}

[[routes]]
{{- range $key := list "name" "topic" "topic_pattern" "field" "table" }}
{{- if hasKey $route $key }}
{{ $key }} = {{ toJson (get $route $key) }}
{{- end }}
{{- end }}
contract = {{ printf "%s/route-%d.json" (include "geoingest.configDir" $) $i | toJson }}
{{- end }}
{{- end }}

{{/*
The contract JSON: config's inline contract, or the demo contract shipped with the chart.
*/}}
{{- define "geoingest.contractJson" -}}
{{- if .Values.contract.inline }}
{{- toPrettyJson .Values.contract.inline }}
{{- else }}
{{- .Files.Get "files/demo_events.json" }}
{{- end }}
{{- end }}

{{/*
Environment of the ingest container and of the table-creating init container: the settings the
chart owns, then secrets from existing Secrets.
*/}}
{{- define "geoingest.env" -}}
- name: GEOINGEST_CONFIG
  value: {{ include "geoingest.configDir" . }}/settings.toml
- name: GEOINGEST_CHECKPOINT_LOCATION
  value: {{ include "geoingest.checkpointLocation" . | quote }}
- name: GEOINGEST_METRICS_PORT
  value: {{ .Values.metrics.port | quote }}
- name: GEOINGEST_SPARK_MASTER
  value: {{ include "geoingest.sparkMaster" . | quote }}
- name: GEOINGEST_SPARK__SPARK_LOCAL_DIR
  value: /scratch/spark-local
{{- with .Values.secrets.catalog }}
{{- if .existingSecret }}
{{- range $env, $key := dict "GEOINGEST_CATALOG__URI" .uriKey "GEOINGEST_CATALOG__CREDENTIAL" .credentialKey "GEOINGEST_CATALOG__TOKEN" .tokenKey }}
{{- if $key }}
- name: {{ $env }}
  valueFrom:
    secretKeyRef:
      name: {{ $.Values.secrets.catalog.existingSecret }}
      key: {{ $key | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- with .Values.secrets.objectStore }}
{{- if .existingSecret }}
{{- $prefix := printf "PYICEBERG_CATALOG__%s__S3__" (upper $.Values.config.catalog_name) }}
{{- range $env, $key := dict "ACCESS_KEY_ID" .accessKeyIdKey "SECRET_ACCESS_KEY" .secretAccessKeyKey "SESSION_TOKEN" .sessionTokenKey }}
{{- if $key }}
- name: {{ $prefix }}{{ $env }}
  valueFrom:
    secretKeyRef:
      name: {{ $.Values.secrets.objectStore.existingSecret }}
      key: {{ $key | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- with .Values.secrets.kafka }}
{{- if and .existingSecret .saslJaasConfigKey }}
- name: GEOINGEST_KAFKA__SASL_JAAS_CONFIG
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret }}
      key: {{ .saslJaasConfigKey | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Volumes the service writes to (the root filesystem is read-only).
*/}}
{{- define "geoingest.scratchVolumeMounts" -}}
- name: scratch
  mountPath: /scratch
- name: tmp
  mountPath: /tmp
{{- end }}

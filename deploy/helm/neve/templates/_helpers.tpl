{{/* Names, labels and the settings every neve pod shares. */}}

{{- define "neve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "neve.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "neve.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "neve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* selector labels of one component: (dict "root" $ "component" "broker") */}}
{{- define "neve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "neve.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "neve.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "neve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "neve.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "neve.etcdUrl" -}}
{{- if .Values.etcd.enabled }}
{{- printf "etcd://%s-etcd:2379/%s" (include "neve.fullname" .) .Values.etcd.root }}
{{- else }}
{{- required "etcd.external.url is required when etcd.enabled is false" .Values.etcd.external.url }}
{{- end }}
{{- end }}

{{- define "neve.objectStoreUrl" -}}
{{- $url := printf "s3://%s/%s" .Values.s3.bucket .Values.s3.prefix }}
{{- if .Values.s3.endpoint }}
{{- printf "%s?endpoint=%s&region=%s" $url .Values.s3.endpoint .Values.s3.region }}
{{- else }}
{{- printf "%s?region=%s" $url .Values.s3.region }}
{{- end }}
{{- end }}

{{- define "neve.s3SecretName" -}}
{{- default (printf "%s-s3" (include "neve.fullname" .)) .Values.s3.existingSecret }}
{{- end }}

{{- define "neve.s3HasKeys" -}}
{{- if or .Values.s3.existingSecret .Values.s3.credentials.accessKeyId }}true{{ end }}
{{- end }}

{{- define "neve.compactorEnabled" -}}
{{- if and .Values.compactor.enabled (or .Values.compactor.catalog.url .Values.compactor.catalog.existingSecret) }}true{{ end }}
{{- end }}

{{- define "neve.catalogSecretName" -}}
{{- default (printf "%s-catalog" (include "neve.fullname" .)) .Values.compactor.catalog.existingSecret }}
{{- end }}

{{/* The environment of every neve pod: the metadata store, the WAL's object store and its keys. */}}
{{- define "neve.clusterEnv" -}}
- name: NEVE_METADATA_URL
  value: {{ include "neve.etcdUrl" . | quote }}
- name: NEVE_WAL_OBJECT_STORE
  value: {{ include "neve.objectStoreUrl" . | quote }}
- name: AWS_REGION
  value: {{ .Values.s3.region | quote }}
{{- if include "neve.s3HasKeys" . }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef: {name: {{ include "neve.s3SecretName" . }}, key: accessKeyId}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef: {name: {{ include "neve.s3SecretName" . }}, key: secretAccessKey}
{{- end }}
{{- end }}

{{/* Extra NEVE_* settings from a values map, sorted. */}}
{{- define "neve.extraEnv" -}}
{{- range $name, $value := . }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- end }}

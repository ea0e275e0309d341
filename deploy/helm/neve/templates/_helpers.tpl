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

{{/* Security's Secrets (values.yaml, security): the operator's, named after the release unless set. */}}
{{- define "neve.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "neve.fullname" .)) .Values.security.tls.secretName }}
{{- end }}

{{- define "neve.scramSecretName" -}}
{{- default (printf "%s-scram" (include "neve.fullname" .)) .Values.security.scram.secretName }}
{{- end }}

{{- define "neve.chunkSecretName" -}}
{{- default (printf "%s-chunk-secret" (include "neve.fullname" .)) .Values.security.chunkSecretName }}
{{- end }}

{{- define "neve.peersHost" -}}
{{- printf "%s-broker-peers.%s.svc" (include "neve.fullname" .) .Release.Namespace }}
{{- end }}

{{/* The chunk port's secret and mutual TLS, for every pod that serves or reads chunks. */}}
{{- define "neve.chunkEnv" -}}
{{- if .Values.security.enabled -}}
- name: NEVE_CACHE_PEER_SECRET_FILE
  value: /etc/neve/chunk/secret
- name: NEVE_CACHE_PEER_TLS_CERT_FILE
  value: /etc/neve/tls/tls.crt
- name: NEVE_CACHE_PEER_TLS_KEY_FILE
  value: /etc/neve/tls/tls.key
- name: NEVE_CACHE_PEER_TLS_CA_FILE
  value: /etc/neve/tls/ca.crt
{{- else -}}
# an open chunk port, on the cluster's network
- name: NEVE_CACHE_PEER_INSECURE
  value: "true"
{{- end }}
{{- end }}

{{- define "neve.securityMounts" -}}
{{- if .Values.security.enabled -}}
- {name: tls, mountPath: /etc/neve/tls, readOnly: true}
- {name: chunk-secret, mountPath: /etc/neve/chunk, readOnly: true}
{{- end }}
{{- end }}

{{- define "neve.securityVolumes" -}}
{{- if .Values.security.enabled -}}
- name: tls
  secret:
    secretName: {{ include "neve.tlsSecretName" . }}
    items:
      - {key: tls.crt, path: tls.crt}
      - {key: tls.key, path: tls.key}
      - {key: ca.crt, path: ca.crt}
- name: chunk-secret
  secret:
    secretName: {{ include "neve.chunkSecretName" . }}
    items:
      - {key: secret, path: secret}
{{- end }}
{{- end }}

{{/* Labels on every object: the kustomize base's part-of, plus Helm's release labels. */}}
{{- define "apportion.labels" -}}
app.kubernetes.io/part-of: apportion
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* The operator's selector: as in the kustomize base, so either can take over the other's pods. */}}
{{- define "apportion.selectorLabels" -}}
app.kubernetes.io/name: apportion-operator
{{- end }}

{{/* The objects of a file under files/ (a link to the kustomize base), with the chart's labels:
one source for both installs. */}}
{{- define "apportion.objectsOf" -}}
{{- $root := index . 0 }}
{{- range $doc := regexSplit "(?m)^---\\s*$" ($root.Files.Get (index . 1)) -1 }}
{{- $object := fromYaml $doc }}
{{- if $object.kind }}
{{- $_ := set $object.metadata "labels" (include "apportion.labels" $root | fromYaml) }}
---
{{ toYaml $object }}
{{- end }}
{{- end }}
{{- end }}

{{/* Whether the operator's role is bound cluster-wide: every namespace watched, or a kopf glob
among them (it then watches every namespace and filters, so a Role per namespace cannot say it). */}}
{{- define "apportion.clusterWide" -}}
{{- $globs := false }}
{{- range .Values.watchedNamespaces }}
{{- if regexMatch "[*?\\[!]" . }}{{ $globs = true }}{{ end }}
{{- end }}
{{- if or (not .Values.watchedNamespaces) $globs }}true{{ end }}
{{- end }}

{{/* The operator's rules in the namespaces it serves (manifests/rbac.yaml says why each). */}}
{{- define "apportion.operatorRules" -}}
- apiGroups: [apportion.dev]
  resources: [graintypes, partitionsets, shardsets]
  verbs: [list, watch, patch]
- apiGroups: [apportion.dev]
  resources: [graintypes/status, partitionsets/status, shardsets/status]
  verbs: [patch]
- apiGroups: [apportion.dev]
  resources: [graintypes/finalizers, partitionsets/finalizers, shardsets/finalizers]
  verbs: [update]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch, create, update, delete]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, patch]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create]
- apiGroups: [apps]
  resources: [deployments, statefulsets]
  verbs: [list, watch]
- apiGroups: [metrics.k8s.io]
  resources: [pods]
  verbs: [list]
{{- end }}

{{/* What is cluster-scoped: kopf's namespace globs and CRD discovery. */}}
{{- define "apportion.operatorClusterRules" -}}
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
{{- end }}

{{/* Marks the holder as the operator, under files/operator-policy.yaml. */}}
{{- define "apportion.operatorMark" -}}
- apiGroups: [apportion.dev]
  resources: [operators]
  verbs: [act]
{{- end }}

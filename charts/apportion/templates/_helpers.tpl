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

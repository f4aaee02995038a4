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

{{/* Base name of every resource: the release name when it already says "railyard", else railyard-<release>. */}}
{{- define "railyard.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" $name .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels of every object; "component" is passed in the dict. */}}
{{- define "railyard.labels" -}}
{{ include "railyard.selectorLabels" . }}
app.kubernetes.io/part-of: railyard
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "railyard.selectorLabels" -}}
app.kubernetes.io/name: railyard-{{ .component }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "railyard.operatorImage" -}}
{{- $img := .Values.operator.image -}}
{{- printf "%s:%s" (required "operator.image.repository is required: set it to the image with railyard-operator (deploy/docker/Dockerfile.operator)" $img.repository) (default .Chart.AppVersion $img.tag) -}}
{{- end -}}

{{- define "railyard.monitorImage" -}}
{{- $img := .Values.monitor.image -}}
{{- printf "%s:%s" (default .Values.operator.image.repository $img.repository) (default (default .Chart.AppVersion .Values.operator.image.tag) $img.tag) -}}
{{- end -}}

{{- define "railyard.workerImage" -}}
{{- $img := .Values.worker.image -}}
{{- printf "%s:%s" (required "worker.image.repository is required: set it to the worker image (deploy/docker/Dockerfile.worker)" $img.repository) (default .Chart.AppVersion $img.tag) -}}
{{- end -}}

{{/* The namespace whose TrainingJobs are run, when rbac.scope is namespace. */}}
{{- define "railyard.watchNamespace" -}}
{{- default .Release.Namespace .Values.rbac.watchNamespace -}}
{{- end -}}

{{/* Pod and container security settings shared by the operator and the monitor (restricted Pod Security level). */}}
{{- define "railyard.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "railyard.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}

{{/*
The labels that name a worker pod's job, pod and node, from the pod's metadata (the PodMonitor's relabelings).
*/}}
{{- define "railyard.podIdentityRelabelings" -}}
- sourceLabels: [__meta_kubernetes_namespace]
  targetLabel: namespace
- sourceLabels: [__meta_kubernetes_pod_label_railyard_dev_job]
  targetLabel: trainingjob
- sourceLabels: [__meta_kubernetes_pod_name]
  targetLabel: pod
- sourceLabels: [__meta_kubernetes_pod_node_name]
  targetLabel: node
{{- end }}

{{/*
Helpers of the istio-cni-rs chart. Every object name starts with "istio-cni" whatever the release
is called: the agent finds its own DaemonSet by the fixed name "istio-cni-node" at shutdown, and
Istio's other charts and tools expect these names.
*/}}

{{- define "cni.name" -}}
istio-cni
{{- end }}

{{/* The DaemonSet (and k8s-app label) name. */}}
{{- define "cni.nodeName" -}}
{{ include "cni.name" . }}-node
{{- end }}

{{/* The image tag: tag, else global.tag, plus "-<variant>" when a variant is set. */}}
{{- define "cni.tag" -}}
{{- $tag := .Values.tag | default .Values.global.tag | toString -}}
{{- $variant := .Values.variant | default .Values.global.variant -}}
{{- if $variant }}{{ printf "%s-%s" $tag $variant }}{{ else }}{{ $tag }}{{ end -}}
{{- end }}

{{/* The full image reference; an `image` with a "/" in it is taken as it is. */}}
{{- define "cni.image" -}}
{{- $image := .Values.image | default "install-cni" -}}
{{- if contains "/" $image -}}
{{ $image }}
{{- else -}}
{{ printf "%s/%s:%s" (.Values.hub | default .Values.global.hub) $image (include "cni.tag" .) }}
{{- end -}}
{{- end }}

{{/* The image pull policy, empty when neither value sets one. */}}
{{- define "cni.pullPolicy" -}}
{{- .Values.pullPolicy | default .Values.global.imagePullPolicy -}}
{{- end }}

{{/*
The host directory the plugin binary goes into: cniBinDir, or when that is empty the GKE location
on GKE clusters (recognised by "-gke" in the server's version) and /opt/cni/bin elsewhere.
*/}}
{{- define "cni.binDir" -}}
{{- if .Values.cniBinDir -}}
{{ .Values.cniBinDir }}
{{- else if contains "-gke" .Capabilities.KubeVersion.GitVersion -}}
/home/kubernetes/bin
{{- else -}}
/opt/cni/bin
{{- end -}}
{{- end }}

{{/* "true" when the agent pod shares the node's network namespace, else empty. */}}
{{- define "cni.hostNetwork" -}}
{{- if and .Values.ambient.enabled .Values.ambient.shareHostNetworkNamespace }}true{{ end -}}
{{- end }}

{{/* "true" when the host /proc mount is needed (in-place repair or ambient), else empty. */}}
{{- define "cni.needsHostProc" -}}
{{- if or .Values.repair.repairPods .Values.ambient.enabled }}true{{ end -}}
{{- end }}

{{/* The owned-config file name as the agent should see it, empty when owned mode is off. */}}
{{- define "cni.ownedConfigFileName" -}}
{{- if .Values.istioOwnedCNIConfig -}}
{{ .Values.istioOwnedCNIConfigFileName | default "02-istio-cni.conflist" }}
{{- end -}}
{{- end }}

{{/* global.resourceScope, checked; lower-cased so "ALL"/"All" work too. */}}
{{- define "cni.resourceScope" -}}
{{- $scope := .Values.global.resourceScope | default "all" | toString | lower -}}
{{- if not (has $scope (list "all" "cluster" "namespace")) -}}
{{- fail (printf "global.resourceScope must be one of all, cluster, namespace; got %q" .Values.global.resourceScope) -}}
{{- end -}}
{{ $scope }}
{{- end }}

{{/* "true" when namespaced objects (DaemonSet, ConfigMap, ServiceAccount, ...) are rendered. */}}
{{- define "cni.renderNamespaced" -}}
{{- if ne (include "cni.resourceScope" .) "cluster" }}true{{ end -}}
{{- end }}

{{/* "true" when cluster-scoped objects (ClusterRoles and their bindings) are rendered. */}}
{{- define "cni.renderClusterScoped" -}}
{{- if ne (include "cni.resourceScope" .) "namespace" }}true{{ end -}}
{{- end }}

{{/* The platform name from `platform` or `global.platform`, empty when none. */}}
{{- define "cni.platform" -}}
{{- coalesce .Values.platform (.Values.global).platform | default "" | toString -}}
{{- end }}

{{/* The standard labels Istio puts on every object it renders. */}}
{{- define "cni.istioLabels" -}}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/part-of: "istio"
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release / revision / operator labels shared by the chart's objects. */}}
{{- define "cni.ownerLabels" -}}
release: {{ .Release.Name }}
istio.io/rev: {{ .Values.revision | default "default" | quote }}
install.operator.istio.io/owning-resource: {{ .Values.ownerName | default "unknown" | quote }}
operator.istio.io/component: "Cni"
app.kubernetes.io/name: {{ include "cni.name" . }}
{{ include "cni.istioLabels" . }}
{{- end }}

{{/* Labels of the objects that carry the `app: istio-cni` label (ConfigMap, RBAC, SA). */}}
{{- define "cni.labels" -}}
app: {{ include "cni.name" . }}
{{ include "cni.ownerLabels" . }}
{{- end }}

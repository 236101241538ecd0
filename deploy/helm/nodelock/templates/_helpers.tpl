{{/* Name prefix of every object: the release name when it contains "nodelock". */}}
{{- define "nodelock.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "nodelock.lockNamespace" -}}
{{- .Values.lockNamespace | default .Release.Namespace -}}
{{- end -}}

{{- define "nodelock.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: nodelock
{{- end -}}

{{/*
A label selector given in values: include "nodelock.labelSelector" .Values.x.selector. Its
matchLabels values are rendered as strings, as "nodelock.nodeSelector" renders a node selector's.
*/}}
{{- define "nodelock.labelSelector" -}}
{{- $selector := deepCopy . -}}
{{- with $selector.matchLabels }}
{{- $_ := set $selector "matchLabels" (include "nodelock.nodeSelector" . | fromYaml) }}
{{- end }}
{{- toYaml $selector }}
{{- end -}}

{{/* Selector labels of one component: include "nodelock.selector" (list . "extender") */}}
{{- define "nodelock.selector" -}}
{{- $ctx := index . 0 -}}
app.kubernetes.io/name: {{ $ctx.Chart.Name }}
app.kubernetes.io/instance: {{ $ctx.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/*
An image reference: include "nodelock.imageRef" (list . repository tag). With
global.imageRegistry set, that registry replaces the repository's own (its first path segment
when that names a host: it has a dot or a port, or is localhost), so every image comes from one
mirror.
*/}}
{{- define "nodelock.imageRef" -}}
{{- $ctx := index . 0 -}}
{{- $repo := index . 1 -}}
{{- $registry := (($ctx.Values.global | default dict).imageRegistry | default "") | trimSuffix "/" -}}
{{- if $registry -}}
{{- $parts := splitList "/" $repo -}}
{{- $first := first $parts -}}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- $repo = join "/" (rest $parts) -}}
{{- end -}}
{{- $repo = printf "%s/%s" $registry $repo -}}
{{- end -}}
{{- printf "%s:%s" $repo (index . 2) -}}
{{- end -}}

{{- define "nodelock.image" -}}
{{- include "nodelock.imageRef" (list . .Values.image.repository (.Values.image.tag | default .Chart.AppVersion)) -}}
{{- end -}}

{{/*
kube-scheduler's image tag: scheduler.image.tag, else the cluster's own version (kube-scheduler
must not be newer than the API server), without a distribution's build suffix (v1.30.4-eks-x ->
v1.30.4).
*/}}
{{- define "nodelock.schedulerImage" -}}
{{- $s := .Values.scheduler.image -}}
{{- $tag := $s.tag | default (regexReplaceAll "[-+].*$" .Capabilities.KubeVersion.Version "") -}}
{{- include "nodelock.imageRef" (list . $s.repository $tag) -}}
{{- end -}}

{{/*
Pod template metadata additions of one workload: include "nodelock.podLabels" (list . "extender")
(the key under .Values); podLabels / podAnnotations at the top level apply to every workload, the
component's own add to them and win.
*/}}
{{- define "nodelock.podLabels" -}}
{{- $ctx := index . 0 -}}
{{- $own := (index $ctx.Values (index . 1)).podLabels | default dict -}}
{{- $all := merge (deepCopy $own) ($ctx.Values.podLabels | default dict) -}}
{{- with $all }}{{ toYaml . }}{{ end -}}
{{- end -}}
{{- define "nodelock.podAnnotations" -}}
{{- $ctx := index . 0 -}}
{{- $own := (index $ctx.Values (index . 1)).podAnnotations | default dict -}}
{{- $all := merge (deepCopy $own) ($ctx.Values.podAnnotations | default dict) -}}
{{- with $all }}{{ toYaml . }}{{ end -}}
{{- end -}}
{{/*
Environment additions of one workload: the top-level extraEnv, then the component's; every value
a string (`--set extraEnv[0].value=1` gives a number, which a container's env refuses).
*/}}
{{- define "nodelock.extraEnv" -}}
{{- $ctx := index . 0 -}}
{{- $env := list -}}
{{- range concat ($ctx.Values.extraEnv | default list) ((index $ctx.Values (index . 1)).extraEnv | default list) -}}
{{- $var := deepCopy . -}}
{{- if hasKey $var "value" }}{{ $_ := set $var "value" (include "nodelock.string" $var.value) }}{{ end -}}
{{- $env = append $env $var -}}
{{- end -}}
{{- with $env }}{{ toYaml . }}{{ end -}}
{{- end -}}

{{- define "nodelock.extenderName" -}}{{ include "nodelock.fullname" . }}-extender{{- end -}}
{{- define "nodelock.devicePluginName" -}}{{ include "nodelock.fullname" . }}-device-plugin{{- end -}}
{{- define "nodelock.schedulerName" -}}{{ include "nodelock.fullname" . }}-scheduler{{- end -}}

{{/* The service account usernames the API server authenticates the parts as. */}}
{{- define "nodelock.extenderUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "nodelock.extenderName" . }}
{{- end -}}
{{- define "nodelock.devicePluginUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "nodelock.devicePluginName" . }}
{{- end -}}

{{- define "nodelock.extenderHost" -}}
{{ include "nodelock.extenderName" . }}.{{ .Release.Namespace }}.svc
{{- end -}}

{{- define "nodelock.extenderSecret" -}}
{{- .Values.tls.extenderSecretName | default (printf "%s-extender-tls" (include "nodelock.fullname" .)) -}}
{{- end -}}
{{- define "nodelock.schedulerSecret" -}}
{{- .Values.tls.schedulerSecretName | default (printf "%s-scheduler-tls" (include "nodelock.fullname" .)) -}}
{{- end -}}

{{/* The annotation keys only the extender may write (handoff/wire.py). */}}
{{- define "nodelock.assignmentKeys" -}}
{{- $p := .Values.annotationPrefix -}}
{{- list (printf "%sassignment" $p) (printf "%stoken" $p) (printf "%sbound-at" $p) | toJson -}}
{{- end -}}

{{/* The one extenders: entry of a KubeSchedulerConfiguration (scheduler_ext/config.py). */}}
{{- define "nodelock.extenderConfig" -}}
{{- $https := .Values.tls.enabled -}}
- urlPrefix: {{ printf "%s://%s:%d" (ternary "https" "http" $https) (include "nodelock.extenderHost" .) (ternary 443 80 $https) }}
  filterVerb: filter
  prioritizeVerb: prioritize
  bindVerb: bind
  weight: {{ .Values.scheduler.weight }}
  enableHTTPS: {{ $https }}
  httpTimeout: {{ .Values.scheduler.httpTimeoutSeconds }}s
  nodeCacheCapable: true
  managedResources:
    - name: {{ .Values.resourceName }}
      ignoredByScheduler: false
    {{- range list "nvidia.com/gpumem" "nvidia.com/gpumem-percentage" "nvidia.com/gpucores" }}
    - name: {{ . }}
      ignoredByScheduler: true
    {{- end }}
    {{- /* MIG resources: exact names, no prefix (migProfiles; its default is scheduler_ext/config.py MIG_PROFILES) */}}
    {{- range .Values.migProfiles }}
    - name: nvidia.com/mig-{{ . }}
      ignoredByScheduler: false
    {{- end }}
  ignorable: false
  {{- if $https }}
  tlsConfig:
    serverName: {{ include "nodelock.extenderHost" . }}
    {{- if .Values.tls.requireClientCert }}
    certFile: /etc/nodelock/scheduler-tls/tls.crt
    keyFile: /etc/nodelock/scheduler-tls/tls.key
    {{- end }}
    caFile: /etc/nodelock/scheduler-tls/ca.crt
  {{- end }}
{{- end -}}

{{/*
A value as a string, for a label or an env var. A whole number that came back as a float
(`helm upgrade --reuse-values` reads the values from JSON, as `--set-json` does) renders as the
integer it was: 73584679, not 7.3584679e+07, which no label accepts.
*/}}
{{- define "nodelock.string" -}}
{{- if and (kindIs "float64" .) (eq (floor .) .) -}}
{{- printf "%.0f" . -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}

{{/* A node selector with every value a string (`--set sel.key=true` would give a boolean). */}}
{{- define "nodelock.nodeSelector" -}}
{{- $out := dict -}}
{{- range $k, $v := . -}}
{{- $_ := set $out $k (include "nodelock.string" $v) -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/*
The generated TLS material as JSON: {"extender": {...Secret data}, "scheduler": {...}}. Made once
per rendering (memoized in .Values.tls) so that the Secrets and the pods' checksum annotations
see the same certificates; reused from the live Secrets on upgrade (lookup).
*/}}
{{- define "nodelock.generatedTLS" -}}
{{- if not (hasKey .Values.tls "_generated") -}}
{{- $ns := .Release.Namespace -}}
{{- $oldExt := lookup "v1" "Secret" $ns (include "nodelock.extenderSecret" .) -}}
{{- $oldSched := lookup "v1" "Secret" $ns (include "nodelock.schedulerSecret" .) -}}
{{- $data := dict -}}
{{- if and $oldExt $oldSched -}}
{{- $data = dict "extender" $oldExt.data "scheduler" $oldSched.data -}}
{{- else -}}
{{- $days := int .Values.tls.validityDays -}}
{{- $ca := genCA (printf "%s-ca" (include "nodelock.fullname" .)) $days -}}
{{- $host := include "nodelock.extenderHost" . -}}
{{- $svc := include "nodelock.extenderName" . -}}
{{- $dns := list $svc (printf "%s.%s" $svc $ns) $host (printf "%s.cluster.local" $host) -}}
{{- $server := genSignedCert $host nil $dns $days $ca -}}
{{- $client := genSignedCert .Values.scheduler.schedulerName nil nil $days $ca -}}
{{- $ext := dict "tls.crt" ($server.Cert | b64enc) "tls.key" ($server.Key | b64enc) "ca.crt" ($ca.Cert | b64enc) -}}
{{- $sched := dict "tls.crt" ($client.Cert | b64enc) "tls.key" ($client.Key | b64enc) "ca.crt" ($ca.Cert | b64enc) -}}
{{- $data = dict "extender" $ext "scheduler" $sched -}}
{{- end -}}
{{- $_ := set .Values.tls "_generated" $data -}}
{{- end -}}
{{- toJson .Values.tls._generated -}}
{{- end -}}

{{/* Pod annotation that restarts a workload when the generated certificates change. */}}
{{- define "nodelock.tlsChecksum" -}}
{{- if and .Values.tls.enabled (eq .Values.tls.source "generate") -}}
checksum/tls: {{ include "nodelock.generatedTLS" . | sha256sum }}
{{- end -}}
{{- end -}}

{{/*
The namespaces whose pods the GPU pod policies judge (and the scheduler-name policy steers), as a
label selector: admission.gpuPods.namespaceSelector, or when that is empty only the namespaces an
operator opted in with the label <annotationPrefix>enabled=true, so that a fresh install leaves
other schedulers' GPU pods alone (docs/decisions/0009-gpu-pod-policies-opt-in.md).
*/}}
{{- define "nodelock.gpuPodNamespaceSelector" -}}
{{- $selector := .Values.admission.gpuPods.namespaceSelector -}}
{{- if not $selector -}}
{{- $selector = dict "matchLabels" (dict (include "nodelock.optInLabel" .) "true") -}}
{{- end -}}
{{- include "nodelock.labelSelector" $selector -}}
{{- end -}}
{{- define "nodelock.optInLabel" -}}{{ .Values.annotationPrefix }}enabled{{- end -}}

{{/* The scheduler names whose pods reach the extender: JSON list, first = the one to steer to. */}}
{{- define "nodelock.gpuPodSchedulers" -}}
{{- if .Values.admission.gpuPods.schedulerNames -}}
{{- toJson .Values.admission.gpuPods.schedulerNames -}}
{{- else if .Values.scheduler.enabled -}}
{{- list .Values.scheduler.schedulerName | toJson -}}
{{- else -}}
["default-scheduler"]
{{- end -}}
{{- end -}}

{{/*
The variables both GPU pod policies share: whether the pod asks for the GPU resource (requests or
limits above zero, app or init containers) and whether an administrator exempted it (the escape
label on the pod and on its namespace). include with (dict "resource" ... "escape" ...).
*/}}
{{- define "nodelock.gpuPodVariables" }}
    - name: resource
      expression: {{ .resource | quote | squote }}
    - name: requested
      expression: >-
        object.spec.containers + (has(object.spec.initContainers) ? object.spec.initContainers : [])
    {{- /* the GPU resource, or MIG instances of any profile (nvidia.com/mig-<profile>) */}}
    - name: gpu
      expression: >-
        variables.requested.exists(c, has(c.resources) &&
        [has(c.resources.limits) ? c.resources.limits : {}, has(c.resources.requests) ? c.resources.requests : {}].exists(m,
        m.exists(k, (k == variables.resource || k.startsWith("nvidia.com/mig-")) &&
        quantity(string(m[k])).isGreaterThan(quantity("0")))))
    - name: escaped
      expression: >-
        has(object.metadata.labels) && {{ .escape | quote }} in object.metadata.labels &&
        object.metadata.labels[{{ .escape | quote }}] == "true" &&
        namespaceObject != null && has(namespaceObject.metadata.labels) &&
        {{ .escape | quote }} in namespaceObject.metadata.labels &&
        namespaceObject.metadata.labels[{{ .escape | quote }}] == "true"
{{- end }}

{{/*
"true" when the MutatingAdmissionPolicy that gives GPU pods the extender's scheduler is rendered:
asked for (admission.enabled, admission.gpuPods.enabled, admission.gpuPods.setSchedulerName), a
scheduler other than default-scheduler to give, and a cluster that serves
admissionregistration.k8s.io/v1 MutatingAdmissionPolicy, which is v1, GA and on by default from
Kubernetes 1.36 (k8s.io/api v0.36.0 admissionregistration/v1/types.go; the MutatingAdmissionPolicy
gate in k8s.io/apiserver pkg/features/kube_features.go). Against a cluster Helm lists the kinds its
discovery serves, so the kind is asked for, not the group version (1.36+ may turn it off with
--runtime-config). Without a cluster (`helm template`) Helm lists group versions only: the policy
is rendered there when told, with --api-versions admissionregistration.k8s.io/v1/MutatingAdmissionPolicy
and a --kube-version of 1.36 or later. v1beta1 (1.34, 1.35) and v1alpha1 (1.32, 1.33) are off by
default and not used.
*/}}
{{- define "nodelock.setsSchedulerName" -}}
{{- $gp := .Values.admission.gpuPods -}}
{{- $target := include "nodelock.gpuPodSchedulers" . | fromJsonArray | first -}}
{{- $served := and (semverCompare ">=1.36.0-0" .Capabilities.KubeVersion.Version) (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy") -}}
{{- if and .Values.admission.enabled $gp.enabled $gp.setSchedulerName (ne $target "default-scheduler") $served -}}
true
{{- end -}}
{{- end -}}

{{/* Names and labels shared by every template. */}}
{{- define "haptic.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels for objects that also carry a selector's labels (which name the instance). */}}
{{- define "haptic.baseLabels" -}}
app.kubernetes.io/part-of: haptic
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "haptic.labels" -}}
{{ include "haptic.baseLabels" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "haptic.controllerSelector" -}}
app.kubernetes.io/name: haptic-controller
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "haptic.haproxySelector" -}}
app.kubernetes.io/name: haproxy
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- /* A container's command, run by sh with HAPTIC_PEER_SELF_<hex of the host name> set empty:
the rate-limit peers' line of this pod then has no address (HAProxy's local peer), in
HAProxy's own parsing and in the Dataplane API's checks (chart/library/haproxy.cfg.j2). */ -}}
{{- define "haptic.withPeerSelf" -}}
{{- printf "export \"HAPTIC_PEER_SELF_$(tr -d '\\n' < /proc/sys/kernel/hostname | od -An -tx1 | tr -d ' \\n')=\"; exec %s" . -}}
{{- end -}}

{{- /* The HAProxy pods' selector in kubectl's syntax (a watched resource's labelSelector). */ -}}
{{- define "haptic.haproxySelectorString" -}}
app.kubernetes.io/name=haproxy,app.kubernetes.io/instance={{ .Release.Name }}
{{- end -}}

{{- define "haptic.dataplaneSecret" -}}
{{- .Values.haproxy.dataplane.existingSecret | default (printf "%s-dataplane" (include "haptic.fullname" .)) -}}
{{- end -}}

{{/* The Dataplane API's TLS Secrets: the given ones, else one the controller makes (a CA and
     the pods' certificate) and both sides read. */}}
{{- define "haptic.dataplaneTlsMade" -}}
{{- $tls := .Values.haproxy.dataplane.tls -}}
{{- if and $tls.enabled (not $tls.podSecretName) (not $tls.controllerSecretName) -}}true{{- end -}}
{{- end -}}

{{- define "haptic.dataplaneTlsPodSecret" -}}
{{- .Values.haproxy.dataplane.tls.podSecretName | default (printf "%s-dataplane-tls" (include "haptic.fullname" .)) -}}
{{- end -}}

{{- define "haptic.dataplaneTlsControllerSecret" -}}
{{- .Values.haproxy.dataplane.tls.controllerSecretName | default (printf "%s-dataplane-tls" (include "haptic.fullname" .)) -}}
{{- end -}}

{{- define "haptic.dataplaneServerName" -}}
{{- .Values.haproxy.dataplane.tls.serverName | default (ternary "dataplane.haptic.internal" "" (eq (include "haptic.dataplaneTlsMade" .) "true")) -}}
{{- end -}}

{{- define "haptic.defaultCertificateSecret" -}}
{{- .Values.tls.defaultCertificateSecret | default (printf "%s-default-cert" (include "haptic.fullname" .)) -}}
{{- end -}}

{{/* The plural of a kind for RBAC, as Kubernetes derives it, unless the value names it. */}}
{{- define "haptic.plural" -}}
{{- $kind := lower .kind -}}
{{- if .resource -}}{{ .resource }}
{{- else if or (hasSuffix "s" $kind) (hasSuffix "x" $kind) (hasSuffix "ch" $kind) (hasSuffix "sh" $kind) -}}{{ $kind }}es
{{- else if and (hasSuffix "y" $kind) (not (regexMatch "[aeiou]y$" $kind)) -}}{{ trimSuffix "y" $kind }}ies
{{- else -}}{{ $kind }}s
{{- end -}}
{{- end -}}

{{/* The API group of an apiVersion ("" for the core group). */}}
{{- define "haptic.group" -}}
{{- if contains "/" . -}}{{ index (splitList "/" .) 0 }}{{- end -}}
{{- end -}}

{{- /* Every watched resource: config.watchedResources, plus the Gateway API's types when
gatewayAPI.enabled (the aliases the Gateway API model reads, src/gateway). config.yaml and
rbac.yaml both use this list, so what is watched is exactly what may be read. */ -}}
{{- define "haptic.tcpServicesConfigMap" -}}
{{- printf "%s-tcp-services" (include "haptic.fullname" .) -}}
{{- end -}}

{{- define "haptic.classParametersConfigMap" -}}
{{- printf "%s-class-parameters" (include "haptic.fullname" .) -}}
{{- end -}}

{{- define "haptic.watchedResources" -}}
{{- $all := deepCopy .Values.config.watchedResources -}}
{{- /* The TCP services ConfigMap (tcpServices), by name, in the release's namespace. */ -}}
{{- $_ := set $all "tcpservices" (dict "apiVersion" "v1" "kind" "ConfigMap" "resource" "configmaps" "namespaces" (list .Release.Namespace) "fieldSelector" (printf "metadata.name=%s" (include "haptic.tcpServicesConfigMap" .)) "indexBy" (list "metadata.namespace" "metadata.name")) -}}
{{- /* The class's IngressClass (its default-class annotation, its parameters), by name, and the
ConfigMap of its parameters (ingressClass.parameters), by name, in the release's namespace. */ -}}
{{- $_ := set $all "ingressclasses" (dict "apiVersion" "networking.k8s.io/v1" "kind" "IngressClass" "resource" "ingressclasses" "fieldSelector" (printf "metadata.name=%s" .Values.ingressClass.name) "indexBy" (list "metadata.name")) -}}
{{- /* The HAProxy pods, when they count rate limits together (haproxy.rateLimitPeers). */ -}}
{{- if .Values.haproxy.rateLimitPeers.enabled -}}
{{- $_ := set $all "haproxypods" (dict "apiVersion" "v1" "kind" "Pod" "resource" "pods" "namespaces" (list .Release.Namespace) "labelSelector" (include "haptic.haproxySelectorString" .) "indexBy" (list "metadata.namespace" "metadata.name")) -}}
{{- end -}}
{{- $_ := set $all "classparameters" (dict "apiVersion" "v1" "kind" "ConfigMap" "resource" "configmaps" "namespaces" (list .Release.Namespace) "fieldSelector" (printf "metadata.name=%s" (include "haptic.classParametersConfigMap" .)) "indexBy" (list "metadata.namespace" "metadata.name")) -}}
{{- if .Values.gatewayAPI.enabled -}}
{{- $gateway := dict -}}
{{- range $alias, $kind := dict "gatewayclasses" "GatewayClass" "gateways" "Gateway" "httproutes" "HTTPRoute" "grpcroutes" "GRPCRoute" "tlsroutes" "TLSRoute" "tcproutes" "TCPRoute" "referencegrants" "ReferenceGrant" -}}
{{- $_ := set $gateway $alias (dict "apiVersion" "gateway.networking.k8s.io/v1" "kind" $kind "resource" $alias "indexBy" (list "metadata.namespace" "metadata.name")) -}}
{{- end -}}
{{- $_ := set $gateway "namespaces" (dict "apiVersion" "v1" "kind" "Namespace" "resource" "namespaces" "indexBy" (list "metadata.name")) -}}
{{- range $alias, $watched := $gateway -}}
{{- if $.Values.gatewayAPI.namespaces -}}
{{- if and (ne $alias "gatewayclasses") (ne $alias "namespaces") -}}
{{- $_ := set $watched "namespaces" $.Values.gatewayAPI.namespaces -}}
{{- end -}}
{{- end -}}
{{- $_ := set $all $alias (merge (get $all $alias | default dict) $watched) -}}
{{- end -}}
{{- end -}}
{{- toYaml $all -}}
{{- end -}}

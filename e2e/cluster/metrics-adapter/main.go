// A custom metrics API server (custom.metrics.k8s.io) that serves Prometheus series as
// Pods metrics, so an HPA can scale on them: what prometheus-adapter does, reduced to the
// one rule the asyncd HPA needs. prometheus-adapter's own module cannot be fetched from
// this machine's Go module proxy; this uses the library prometheus-adapter is built on,
// sigs.k8s.io/custom-metrics-apiserver.
//
// Debian's Prometheus is built without Kubernetes service discovery, so the scenario's
// Prometheus finds the dispatchers through DNS (the chart's headless dispatcher metrics
// Service) and its series carry `instance="<pod IP>:<port>"`, not pod names. The adapter
// therefore looks the pods up (name and IP) and asks
//
//	sum by (instance) (<metric>{instance=~"<ip1>:.*|<ip2>:.*",<metric selector>})
//
// The HPA's metric selector (the operator sets task_type=<the job's task type>) becomes
// label matchers, as prometheus-adapter does.
// Flags: --prometheus-url (http://prometheus.monitoring.svc:9090), --metrics (comma-
// separated series names served for pods, default asyncd_due_backlog), plus the
// apiserver flags of custom-metrics-apiserver (--secure-port, --cert-dir, ...).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	apierr "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/component-base/logs"
	"k8s.io/klog/v2"
	"k8s.io/metrics/pkg/apis/custom_metrics"

	basecmd "sigs.k8s.io/custom-metrics-apiserver/pkg/cmd"
	"sigs.k8s.io/custom-metrics-apiserver/pkg/provider"
	"sigs.k8s.io/custom-metrics-apiserver/pkg/provider/helpers"
)

var podsResource = schema.GroupResource{Resource: "pods"}

type promProvider struct {
	client  dynamic.Interface
	mapper  apimeta.RESTMapper
	promURL string
	metrics map[string]bool
	http    *http.Client
}

// matchers turns a label selector into PromQL label matchers (",a=\"b\",...").
func matchers(sel labels.Selector) (string, error) {
	if sel == nil {
		return "", nil
	}
	reqs, _ := sel.Requirements()
	out := ""
	for _, r := range reqs {
		vals := r.Values().List()
		switch r.Operator() {
		case selection.Equals, selection.DoubleEquals:
			out += fmt.Sprintf(",%s=%q", r.Key(), vals[0])
		case selection.NotEquals:
			out += fmt.Sprintf(",%s!=%q", r.Key(), vals[0])
		case selection.In:
			out += fmt.Sprintf(",%s=~%q", r.Key(), strings.Join(vals, "|"))
		case selection.NotIn:
			out += fmt.Sprintf(",%s!~%q", r.Key(), strings.Join(vals, "|"))
		case selection.Exists:
			out += fmt.Sprintf(",%s!=\"\"", r.Key())
		case selection.DoesNotExist:
			out += fmt.Sprintf(",%s=\"\"", r.Key())
		default:
			return "", fmt.Errorf("metric selector operator %q is not supported", r.Operator())
		}
	}
	return out, nil
}

var podsGVR = schema.GroupVersionResource{Version: "v1", Resource: "pods"}

// podIPs returns the IP of each running pod among `names` (all matching `selector` when
// names is nil) in `namespace`.
func (p *promProvider) podIPs(ctx context.Context, namespace string, selector labels.Selector) (map[string]string, error) {
	opts := metav1.ListOptions{}
	if selector != nil {
		opts.LabelSelector = selector.String()
	}
	list, err := p.client.Resource(podsGVR).Namespace(namespace).List(ctx, opts)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, item := range list.Items {
		ip, _, _ := unstructured.NestedString(item.Object, "status", "podIP")
		if ip != "" {
			out[item.GetName()] = ip
		}
	}
	return out, nil
}

// query returns the value of `metric` (matching `sel`) per pod, for the pods of `ips`
// (pod name -> IP).
func (p *promProvider) query(ctx context.Context, metric string, ips map[string]string, sel labels.Selector) (map[string]float64, error) {
	extra, err := matchers(sel)
	if err != nil {
		return nil, err
	}
	byIP := map[string]string{}
	alts := []string{}
	for name, ip := range ips {
		byIP[ip] = name
		alts = append(alts, strings.ReplaceAll(ip, ".", `\\.`)+":.*")
	}
	q := fmt.Sprintf(`sum by (instance) (%s{instance=~"%s"%s})`, metric, strings.Join(alts, "|"), extra)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.promURL+"/api/v1/query?query="+url.QueryEscape(q), nil)
	if err != nil {
		return nil, err
	}
	resp, err := p.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("prometheus answer: %w", err)
	}
	if body.Status != "success" {
		return nil, fmt.Errorf("prometheus: %s", body.Error)
	}
	out := map[string]float64{}
	for _, r := range body.Data.Result {
		s, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			continue
		}
		host := r.Metric["instance"]
		if i := strings.LastIndex(host, ":"); i >= 0 {
			host = host[:i]
		}
		if name, ok := byIP[host]; ok {
			out[name] += v
		}
	}
	return out, nil
}

func (p *promProvider) value(info provider.CustomMetricInfo, name types.NamespacedName, v float64) (*custom_metrics.MetricValue, error) {
	ref, err := helpers.ReferenceFor(p.mapper, name, info)
	if err != nil {
		return nil, err
	}
	return &custom_metrics.MetricValue{
		DescribedObject: ref,
		Metric:          custom_metrics.MetricIdentifier{Name: info.Metric},
		Timestamp:       metav1.Now(),
		Value:           *resource.NewMilliQuantity(int64(v*1000), resource.DecimalSI),
	}, nil
}

func (p *promProvider) served(info provider.CustomMetricInfo) bool {
	return info.GroupResource == podsResource && info.Namespaced && p.metrics[info.Metric]
}

func (p *promProvider) GetMetricByName(ctx context.Context, name types.NamespacedName, info provider.CustomMetricInfo, metricSelector labels.Selector) (*custom_metrics.MetricValue, error) {
	if !p.served(info) {
		return nil, provider.NewMetricNotFoundError(info.GroupResource, info.Metric)
	}
	ips, err := p.podIPs(ctx, name.Namespace, nil)
	if err != nil {
		return nil, err
	}
	ip, ok := ips[name.Name]
	if !ok {
		return nil, provider.NewMetricNotFoundForError(info.GroupResource, info.Metric, name.Name)
	}
	values, err := p.query(ctx, info.Metric, map[string]string{name.Name: ip}, metricSelector)
	if err != nil {
		return nil, apierr.NewServiceUnavailable(err.Error())
	}
	v, ok := values[name.Name]
	if !ok {
		return nil, provider.NewMetricNotFoundForError(info.GroupResource, info.Metric, name.Name)
	}
	return p.value(info, name, v)
}

func (p *promProvider) GetMetricBySelector(ctx context.Context, namespace string, selector labels.Selector, info provider.CustomMetricInfo, metricSelector labels.Selector) (*custom_metrics.MetricValueList, error) {
	if !p.served(info) {
		return nil, provider.NewMetricNotFoundError(info.GroupResource, info.Metric)
	}
	ips, err := p.podIPs(ctx, namespace, selector)
	if err != nil {
		return nil, err
	}
	list := &custom_metrics.MetricValueList{Items: []custom_metrics.MetricValue{}}
	if len(ips) == 0 {
		return list, nil
	}
	values, err := p.query(ctx, info.Metric, ips, metricSelector)
	if err != nil {
		return nil, apierr.NewServiceUnavailable(err.Error())
	}
	for n := range ips {
		v, ok := values[n]
		if !ok {
			continue // not scraped yet: the HPA treats a missing pod conservatively
		}
		mv, err := p.value(info, types.NamespacedName{Namespace: namespace, Name: n}, v)
		if err != nil {
			return nil, err
		}
		list.Items = append(list.Items, *mv)
	}
	return list, nil
}

func (p *promProvider) ListAllMetrics() []provider.CustomMetricInfo {
	out := []provider.CustomMetricInfo{}
	for m := range p.metrics {
		out = append(out, provider.CustomMetricInfo{GroupResource: podsResource, Namespaced: true, Metric: m})
	}
	return out
}

func main() {
	logs.InitLogs()
	defer logs.FlushLogs()

	cmd := &basecmd.AdapterBase{Name: "asyncd-metrics-adapter"}
	promURL := cmd.Flags().String("prometheus-url", "http://prometheus.monitoring.svc:9090", "Prometheus base URL")
	metricList := cmd.Flags().String("metrics", "asyncd_due_backlog", "comma-separated series served as Pods metrics")
	logs.AddFlags(cmd.Flags())
	if err := cmd.Flags().Parse(os.Args); err != nil {
		klog.Fatalf("flags: %v", err)
	}
	client, err := cmd.DynamicClient()
	if err != nil {
		klog.Fatalf("dynamic client: %v", err)
	}
	mapper, err := cmd.RESTMapper()
	if err != nil {
		klog.Fatalf("REST mapper: %v", err)
	}
	p := &promProvider{
		client: client, mapper: mapper, promURL: strings.TrimRight(*promURL, "/"),
		metrics: map[string]bool{}, http: &http.Client{Timeout: 5 * time.Second},
	}
	for _, m := range strings.Split(*metricList, ",") {
		if m = strings.TrimSpace(m); m != "" {
			p.metrics[m] = true
		}
	}
	cmd.WithCustomMetrics(p)
	klog.Infof("serving %v from %s", *metricList, p.promURL)
	if err := cmd.Run(context.Background()); err != nil {
		klog.Fatalf("adapter: %v", err)
	}
}

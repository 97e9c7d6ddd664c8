// airflow-spot's test cloud: insufficient capacity, emulated in Karpenter's kwok provider.
//
// Copied by tools/k8s/build.sh into the patched copy of sigs.k8s.io/karpenter (package
// kwok/cloudprovider), where the upstream Create and GetInstanceTypes are renamed
// createUpstream and getInstanceTypesUpstream and wrapped here. Nothing changes unless
// $AIRFLOW_SPOT_KWOK_ICE_FILE names a file of rules, one a line, read at every call:
//
//	karpenter.sh/capacity-type=spot
//	topology.kubernetes.io/zone=test-zone-a,node.kubernetes.io/instance-type=c-1x-amd64-linux
//
// A rule is out of capacity for every offering whose labels (instance type, zone, capacity
// type) it all matches. Create fails with an InsufficientCapacityError, as a real cloud's
// launch does, when every offering the NodeClaim allows is out (Karpenter then publishes its
// InsufficientCapacityError event on the NodeClaim and deletes it). From then on, for
// $AIRFLOW_SPOT_KWOK_ICE_TTL (a Go duration, 3m by default: the AWS provider's unavailable-
// offerings cache) and while the rule is still in the file, GetInstanceTypes lists those
// offerings unavailable, so Karpenter stops trying them, as it does on AWS. Any change to the
// file starts afresh (a failure counts for the file's content it happened under).
//
// It also names the reservation label of reserved capacity (reservationLabel): Karpenter core
// tells reserved offerings apart by cloudprovider.ReservationIDLabel, which each cloud provider
// sets (AWS: karpenter.k8s.aws/capacity-reservation-id) and the upstream kwok provider leaves
// empty, so a reserved offering in an instance-types file (INSTANCE_TYPES_FILE_PATH) would
// give its NodeClaim a requirement with an empty key (and the NodeClaim CRD refuses new keys
// of the karpenter.kwok.sh domain, hence another domain). With it, Karpenter's ReservedCapacity
// feature (on by default in v1.14) launches reserved offerings from the kwok provider.
package kwok

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	v1 "sigs.k8s.io/karpenter/pkg/apis/v1"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/scheduling"
)

const (
	iceFileEnv = "AIRFLOW_SPOT_KWOK_ICE_FILE"
	iceTTLEnv  = "AIRFLOW_SPOT_KWOK_ICE_TTL"
)

const reservationLabel = "airflow-spot.test/reservation-id"

func init() {
	if cloudprovider.ReservationIDLabel == "" {
		cloudprovider.ReservationIDLabel = reservationLabel
	}
}

var iceHits = struct {
	sync.Mutex
	at map[string]time.Time // file content + rule -> when a launch last failed on it
}{at: map[string]time.Time{}}

// iceRules reads the rules file: rule text -> its key=value pairs, and the file's content
// (the key its failures are kept under).
func iceRules() (map[string]map[string]string, string) {
	path := os.Getenv(iceFileEnv)
	if path == "" {
		return nil, ""
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, ""
	}
	rules := map[string]map[string]string{}
	for _, line := range strings.Split(string(raw), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		pairs := map[string]string{}
		for _, kv := range strings.Split(line, ",") {
			if k, v, ok := strings.Cut(strings.TrimSpace(kv), "="); ok {
				pairs[k] = v
			}
		}
		rules[line] = pairs
	}
	return rules, string(raw)
}

func offeringLabels(it *cloudprovider.InstanceType, of *cloudprovider.Offering) map[string]string {
	labels := map[string]string{corev1.LabelInstanceTypeStable: it.Name}
	for _, r := range of.Requirements {
		if r.Len() == 1 && r.Operator() == corev1.NodeSelectorOpIn {
			labels[r.Key] = r.Values()[0]
		}
	}
	return labels
}

// outOf returns the first rule that the offering's labels all match ("" if none).
func outOf(rules map[string]map[string]string, labels map[string]string) string {
	for text, pairs := range rules {
		hit := true
		for k, v := range pairs {
			if labels[k] != v {
				hit = false
				break
			}
		}
		if hit {
			return text
		}
	}
	return ""
}

func (c CloudProvider) Create(ctx context.Context, nodeClaim *v1.NodeClaim) (*v1.NodeClaim, error) {
	rules, version := iceRules()
	if len(rules) == 0 {
		return c.launch(ctx, nodeClaim)
	}
	reqs := scheduling.NewNodeSelectorRequirementsWithMinValues(nodeClaim.Spec.Requirements...)
	hit, offerings := map[string]bool{}, 0
	for _, name := range reqs.Get(corev1.LabelInstanceTypeStable).Values() {
		it, err := c.getInstanceType(name)
		if err != nil {
			continue
		}
		for _, of := range it.Offerings.Available().Compatible(reqs) {
			offerings++
			rule := outOf(rules, offeringLabels(it, of))
			if rule == "" {
				return c.launch(ctx, nodeClaim) // one offering has capacity
			}
			hit[rule] = true
		}
	}
	if offerings == 0 {
		return c.launch(ctx, nodeClaim)
	}
	names := make([]string, 0, len(hit))
	iceHits.Lock()
	for rule := range hit {
		iceHits.at[version+"\x00"+rule] = time.Now()
		names = append(names, rule)
	}
	iceHits.Unlock()
	return nil, cloudprovider.NewInsufficientCapacityError(fmt.Errorf(
		"insufficient capacity: all %d offerings of NodeClaim %s are out of capacity in the "+
			"test cloud (%s)", offerings, nodeClaim.Name, strings.Join(names, "; ")))
}

// launch is the upstream Create given only the NodeClaim's instance types that have an
// offering it can launch. Upstream's toNode takes the cheapest offering of each instance type
// the NodeClaim lists and keeps the last type's when that type has none (a nil offering, then
// a nil dereference in addInstanceLabels): a NodeClaim narrowed to a reserved offering lists
// instance types without one.
func (c CloudProvider) launch(ctx context.Context, nodeClaim *v1.NodeClaim) (*v1.NodeClaim, error) {
	reqs := scheduling.NewNodeSelectorRequirementsWithMinValues(nodeClaim.Spec.Requirements...)
	var keep []string
	for _, name := range reqs.Get(corev1.LabelInstanceTypeStable).Values() {
		if it, err := c.getInstanceType(name); err == nil && len(it.Offerings.Available().Compatible(reqs)) > 0 {
			keep = append(keep, name)
		}
	}
	if len(keep) == 0 {
		return c.createUpstream(ctx, nodeClaim)
	}
	narrowed := nodeClaim.DeepCopy()
	for i, r := range narrowed.Spec.Requirements {
		if r.Key == corev1.LabelInstanceTypeStable {
			narrowed.Spec.Requirements[i].Operator = corev1.NodeSelectorOpIn
			narrowed.Spec.Requirements[i].Values = keep
		}
	}
	return c.createUpstream(ctx, narrowed)
}

func (c CloudProvider) GetInstanceTypes(ctx context.Context, nodePool *v1.NodePool) ([]*cloudprovider.InstanceType, error) {
	its, err := c.getInstanceTypesUpstream(ctx, nodePool)
	rules, version := iceRules()
	if err != nil || len(rules) == 0 {
		return its, err
	}
	ttl, perr := time.ParseDuration(os.Getenv(iceTTLEnv))
	if perr != nil {
		ttl = 3 * time.Minute
	}
	live := map[string]map[string]string{}
	iceHits.Lock()
	for rule, pairs := range rules {
		if at, ok := iceHits.at[version+"\x00"+rule]; ok && time.Since(at) < ttl {
			live[rule] = pairs
		}
	}
	iceHits.Unlock()
	if len(live) == 0 {
		return its, nil
	}
	out := make([]*cloudprovider.InstanceType, 0, len(its))
	for _, it := range its {
		offs := make(cloudprovider.Offerings, 0, len(it.Offerings))
		for _, of := range it.Offerings {
			cp := *of
			if outOf(live, offeringLabels(it, of)) != "" {
				cp.Available = false
			}
			offs = append(offs, &cp)
		}
		out = append(out, &cloudprovider.InstanceType{
			Name: it.Name, Requirements: it.Requirements, Offerings: offs, Capacity: it.Capacity,
			DynamicResources: it.DynamicResources, Overhead: it.Overhead,
		})
	}
	return out, nil
}

// A least-recently-used map of shared, immutable values: bounded, guarded by
// one mutex. The plan caches (plan_cache.cpp, perm_cache.cpp) are made of it.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

namespace flashmla_perm {

template <class Key, class Value>
class BoundedCache {
 public:
  explicit BoundedCache(int64_t capacity) : capacity_(capacity) {}

  // The value under `key` (now the most recently used), or null.
  std::shared_ptr<const Value> find(const Key& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second);
    return it->second->second;
  }

  // Stores `value` under `key` (replacing any), evicting the least recently used.
  void put(const Key& key, std::shared_ptr<const Value> value) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(key);
    if (it != index_.end()) {
      order_.erase(it->second);
      index_.erase(it);
    }
    order_.emplace_front(key, std::move(value));
    index_[key] = order_.begin();
    if (static_cast<int64_t>(order_.size()) > capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
  }

  // find, or make a value and put it (two threads may both make one; one wins).
  template <class Make>
  std::shared_ptr<const Value> get(const Key& key, Make&& make) {
    if (auto found = find(key)) return found;
    auto made = std::make_shared<const Value>(make());
    put(key, made);
    return made;
  }

  int64_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int64_t>(order_.size());
  }

  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    index_.clear();
    order_.clear();
  }

 private:
  const int64_t capacity_;
  std::mutex mu_;
  std::list<std::pair<Key, std::shared_ptr<const Value>>> order_;
  std::map<Key, typename std::list<std::pair<Key, std::shared_ptr<const Value>>>::iterator> index_;
};

}  // namespace flashmla_perm

// result.hpp: how the embedding API reports failure: a Status, or a Result<T> holding either a
// value or the error's message. Nothing in the API prints, exits or lets an exception out.
#pragma once

#include "dist/export.hpp"

#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

namespace dist {

/// Success, or an error with a message (one or more lines, ready to show to a user).
class Status {
  public:
    Status() = default;
    static Status error(std::string message) { return Status(std::move(message)); }

    bool ok() const { return !failed_; }
    explicit operator bool() const { return ok(); }
    /// The error's text; "" on success.
    const std::string& message() const { return message_; }

  private:
    explicit Status(std::string message) : message_(std::move(message)), failed_(true) {}

    std::string message_;
    bool failed_ = false;
};

/// A value, or the Status of the failure that prevented it.
template <class T> class Result {
  public:
    Result(T value) : value_(std::move(value)) {}
    Result(Status error) : status_(std::move(error)) {
        if (status_.ok()) status_ = Status::error("a Result was made from a successful Status");
    }

    bool ok() const { return value_.has_value(); }
    explicit operator bool() const { return ok(); }
    const Status& status() const { return status_; }
    /// The error's text; "" on success.
    const std::string& error() const { return status_.message(); }

    /// The value; throws std::logic_error when there is none (check ok() first).
    T& value() & { return (check(), *value_); }
    const T& value() const& { return (check(), *value_); }
    T&& value() && { return (check(), std::move(*value_)); }
    T& operator*() & { return value(); }
    const T& operator*() const& { return value(); }
    T* operator->() { return &value(); }
    const T* operator->() const { return &value(); }

  private:
    void check() const {
        if (!value_) throw std::logic_error("dist::Result has no value: " + status_.message());
    }

    std::optional<T> value_;
    Status status_;
};

} // namespace dist
